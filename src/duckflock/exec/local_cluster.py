"""Ranks as threads of this process, linked by the in-process transport: the same planner, stages
and exchanges without MPI. Used by the property tests, and for trying duckflock without mpiexec."""

from __future__ import annotations

import threading

from duckflock.catalog import Catalog
from duckflock.config import Config
from duckflock.exec.driver import Driver, serve
from duckflock.exec.progress import ProgressCallback
from duckflock.exec.runtime import Runtime
from duckflock.transport.inproc import InProcTransport


class LocalCluster:
    def __init__(self, data: str, ranks: int, config: Config | None = None):
        config = config or Config.from_env()
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
        self.driver = Driver(self.runtimes[0])

    # The Session backend protocol: run, plan, ranks, close.
    def run(self, query: str, profile: bool = False, progress: ProgressCallback | None = None):
        return self.driver.run(query, profile=profile, progress=progress)

    def plan(self, query: str):
        return self.driver.plan(query)

    @property
    def ranks(self) -> int:
        return len(self.runtimes)

    def close(self) -> None:
        self.driver.broadcast_stop()
        for t in self._threads:
            t.join(timeout=30)
        for rt in self.runtimes:
            rt.close()
