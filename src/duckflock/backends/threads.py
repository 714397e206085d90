"""Ranks as threads of this process, linked by the in-process transport: the same planner, stages
and exchanges without MPI. Used by the property tests, and for trying duckflock without mpiexec."""

from __future__ import annotations

import threading

from duckflock.backends.driver import DriverBackend
from duckflock.catalog import Catalog
from duckflock.config import Config
from duckflock.exec.driver import Driver, serve
from duckflock.exec.runtime import Runtime
from duckflock.transport.inproc import InProcTransport


class ThreadsBackend(DriverBackend):
    def __init__(self, data: str, ranks: int, config: Config):
        self.runtimes = [
            Runtime.create(t, Catalog.load(data), config, ranks_on_node=ranks)
            for t in InProcTransport.group(ranks)
        ]
        self._threads = [
            threading.Thread(target=serve, args=(rt,), name=f"duckflock-rank-{rt.rank}", daemon=True)
            for rt in self.runtimes[1:]
        ]
        for t in self._threads:
            t.start()
        super().__init__(Driver(self.runtimes[0]))

    def close(self) -> None:
        self.driver.broadcast_stop()
        for t in self._threads:
            t.join(timeout=30)
        for rt in self.runtimes:
            rt.close()
