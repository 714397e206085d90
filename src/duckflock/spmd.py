"""SPMD entry for programs started by mpiexec or srun: rank 0 drives, every other rank serves."""

from __future__ import annotations

import os

from duckflock.backends.driver import DriverBackend
from duckflock.catalog import Catalog
from duckflock.config import Config
from duckflock.exec.driver import Driver, serve
from duckflock.exec.runtime import Runtime, mpi_runtime
from duckflock.session import Session


class spmd:
    """``with spmd(data_dir) as db:`` — on rank 0 ``db`` is a Session; on the other ranks the
    context serves queries until rank 0 leaves its block, then gives ``None``."""

    def __init__(self, data: str | os.PathLike[str], config: Config | None = None):
        self.data = data
        self.config = config or Config.from_env()
        self.rt: Runtime | None = None
        self.driver: Driver | None = None

    def __enter__(self):
        self.rt = mpi_runtime(Catalog.load(self.data), self.config)
        if self.rt.rank != 0:
            serve(self.rt)
            return None
        self.driver = Driver(self.rt)
        return Session(DriverBackend(self.driver))

    def __exit__(self, *exc) -> None:
        assert self.rt is not None
        if self.driver is not None:
            self.driver.broadcast_stop()
        self.rt.close()
