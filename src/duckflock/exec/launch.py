"""Starting MPI jobs: detect whether we already run under mpiexec/srun, or launch mpiexec ourselves."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from duckflock.errors import DuckflockError


def under_mpi() -> bool:
    """True when this process was started by an MPI launcher (or srun) as one of several ranks."""
    if any(v in os.environ for v in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")):
        return True
    return "SLURM_STEP_ID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1


def launcher_rank() -> int | None:
    """This process's rank as told by the launcher's environment (None outside an MPI job)."""
    for var in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    return None


def mpiexec_path() -> str:
    """The mpiexec installed next to this Python (MPICH from PyPI), else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    found = shutil.which("mpiexec")
    if not found:
        raise DuckflockError("mpiexec not found: install the 'mpich' package (pip install mpich mpi4py)")
    return found


def mpiexec_argv(ranks: int, python_args: list[str]) -> list[str]:
    """``mpiexec -n ranks python <python_args>`` with this interpreter."""
    if ranks < 1:
        raise DuckflockError(f"--ranks must be at least 1, got {ranks}")
    return [mpiexec_path(), "-n", str(ranks), sys.executable, *python_args]
