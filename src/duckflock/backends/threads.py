"""Ranks as threads of this process, linked by the in-process transport: the same planner, stages
and exchanges without MPI. The CLI's jobs on this machine run so (in a child, exec/hosting/forked.py), as do
the property tests and ``connect(transport="threads")``."""

from __future__ import annotations

from duckflock.backends.driver import DriverBackend
from duckflock.catalog import Catalog
from duckflock.config import Config
from duckflock.exec.control.driver import Driver
from duckflock.exec.hosting.ranks import LocalRanks
from duckflock.exec.resources.budget import own_anon_bytes
from duckflock.exec.resources.fused import ProcessRanks
from duckflock.exec.resources.runtime import Runtime
from duckflock.transport.inproc import InProcTransport


class ThreadsBackend(DriverBackend):
    def __init__(self, data: str, ranks: int, config: Config, fatal_exits: bool = False):
        """``fatal_exits``: see LocalRanks (for a process that runs nothing but the job)."""
        held = own_anon_bytes() // ranks  # this process's libraries serve all of its ranks
        process = ProcessRanks(tuple(range(ranks))) if ranks > 1 else None
        runtimes = [
            Runtime.create(t, Catalog.load(data), config, ranks, held, process)
            for t in InProcTransport.group(ranks)
        ]
        self.ranks_here = LocalRanks(runtimes, fatal_exits)
        super().__init__(Driver(runtimes[0]))

    def close(self) -> None:
        self.driver.broadcast_stop()
        self.ranks_here.close()
