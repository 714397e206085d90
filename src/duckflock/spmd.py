"""SPMD entry for programs started by mpiexec or srun: rank 0 drives, every other rank serves."""

from __future__ import annotations

import os

from duckflock.backends.driver import DriverBackend
from duckflock.config import Config
from duckflock.exec.control.driver import Driver
from duckflock.exec.hosting.ranks import LocalRanks
from duckflock.exec.resources.runtime import mpi_runtimes
from duckflock.session import Session


class spmd:
    """``with spmd(data_dir) as db:`` — on rank 0 ``db`` is a Session; on the other ranks the
    context serves queries until rank 0 leaves its block, then gives ``None``. A process may host
    several ranks (``DUCKFLOCK_RANKS_PER_PROCESS``): its first is the one in this block."""

    def __init__(self, data: str | os.PathLike[str], config: Config | None = None):
        self.data = data
        self.config = config or Config.from_env()
        self.ranks: LocalRanks | None = None
        self.driver: Driver | None = None

    def __enter__(self):
        self.ranks = LocalRanks(mpi_runtimes(self.data, self.config), fatal_exits=True)
        if self.ranks.first.rank != 0:
            self.ranks.serve()
            return None
        self.driver = Driver(self.ranks.first)
        return Session(DriverBackend(self.driver))

    def __exit__(self, *exc) -> None:
        assert self.ranks is not None
        if self.driver is not None:
            self.driver.broadcast_stop()
        self.ranks.close()
