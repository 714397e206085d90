"""Starting MPI jobs: detect whether we already run under mpiexec/srun, or launch mpiexec ourselves."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import IO

from duckflock.errors import DuckflockError


def under_mpi() -> bool:
    """True when this process was started by an MPI launcher (or srun) as one of several ranks."""
    if any(v in os.environ for v in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")):
        return True
    return "SLURM_STEP_ID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1


def launcher_rank() -> int | None:
    """This process's rank as told by the launcher's environment (None outside an MPI job)."""
    for var in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", STORAGE_RANK_ENV):
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


PER_PROCESS_ENV = "DUCKFLOCK_RANKS_PER_PROCESS"
# A rank of a storage job (exec/hosting/storage_launch.py; exec/hosting/guard.py reads it too): its
# rank, the job's rank count and its id, the name of its directory at the exchange URI.
STORAGE_RANK_ENV = "DUCKFLOCK_STORAGE_RANK"
STORAGE_RANKS_ENV = "DUCKFLOCK_STORAGE_RANKS"
STORAGE_JOB_ENV = "DUCKFLOCK_STORAGE_JOB"


def owned_temp_dir(kind: str) -> str:
    """A new directory for this process's job (``kind``: job, session), named with its pid, after
    removing those whose owner is gone (killed before it could remove its own)."""
    from duckflock.exec.resources.budget import remove_orphans

    remove_orphans(
        Path(tempfile.gettempdir()), f"duckflock-{kind}-*-*", rf"duckflock-{kind}-(?P<pid>\d+)-[^-]+"
    )
    return tempfile.mkdtemp(prefix=f"duckflock-{kind}-{os.getpid()}-")


def per_process(ranks: int, configured: int) -> int:
    """Ranks in each process of a job of ``ranks`` ranks started here: ``configured`` (0: all)."""
    if ranks < 1:
        raise DuckflockError(f"--ranks must be at least 1, got {ranks}")
    k = configured or ranks
    if k > ranks:
        raise DuckflockError(f"ranks_per_process is {k}, more than the job's {ranks} ranks")
    if ranks % k:
        raise DuckflockError(f"{ranks} ranks do not split into processes of {k} (ranks_per_process)")
    return k


def mpiexec_job(
    ranks: int, configured: int, python_args: list[str], job_dir: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a job of ``ranks`` ranks, ``per_process(ranks, configured)``
    in each of its processes."""
    k = per_process(ranks, configured)
    return mpiexec_argv(ranks // k, python_args, job_dir), {PER_PROCESS_ENV: str(k)}


def mpiexec_argv(processes: int, python_args: list[str], job_dir: str | None = None) -> list[str]:
    """``mpiexec -n processes python <python_args>`` with this interpreter. With ``job_dir`` each
    process runs under ``exec.hosting.guard``, which records there its death by a signal (see
    ``job_outcome``)."""
    if processes < 1:
        raise DuckflockError(f"--ranks must be at least 1, got {processes}")
    # The guard runs by file path, not ``-m``: that would import the duckflock package (DuckDB,
    # Arrow, ...) into a process that only waits, once per rank.
    guard_py = str(Path(__file__).with_name("guard.py"))
    guard = ["-I", "-S", guard_py, job_dir, sys.executable] if job_dir else []
    return [mpiexec_path(), "-n", str(processes), sys.executable, *guard, *python_args]


# MPICH's banner when a process of the job dies: a line of '=' starts it.
_BANNER = re.compile(rb"^={20,}\s*$")


def relay_without_banner(source: IO[bytes], sink: IO[bytes]) -> bytes:
    """Copy mpiexec's output through, line by line, up to MPICH's termination banner; return the
    banner and what follows it (dropped: duckflock reports the death in one message of its own)."""
    held = b""
    for line in iter(source.readline, b""):
        if held or _BANNER.match(line):
            held += line
            continue
        sink.write(line)
        sink.flush()
    return held


def job_outcome(job_dir: str, code: int, banner: bytes, per_process: int = 1) -> str | None:
    """The one message for a job whose rank died by a signal (None when no rank did); its processes
    held ``per_process`` ranks each."""
    death = describe_deaths(Path(job_dir), per_process)
    if death is not None:
        return death
    if banner:
        said = re.search(rb"EXIT STRING: ([^\n]*)", banner)
        what = said.group(1).decode(errors="replace").strip() if said else f"exit code {code}"
        return f"a rank of the MPI job ended abnormally: {what}"
    return None


_CAUSES: dict[int, str] = {
    signal.SIGKILL: "most likely the kernel's out-of-memory killer: it needed more memory than "
    "the node allows; give each rank less (DUCKFLOCK_MEMORY_LIMIT_BYTES), use fewer ranks per node or "
    "more nodes",
    signal.SIGSEGV: "a crash inside DuckDB or a native library",
    signal.SIGBUS: "a crash reading a memory-mapped file (a file changed or a disk filled up)",
    signal.SIGABRT: "an internal abort in a native library",
    signal.SIGTERM: "stopped from outside (a scheduler time limit, or kill)",
    signal.SIGINT: "interrupted (Ctrl-C)",
}


def describe_deaths(job: Path, per_process: int = 1) -> str | None:
    """One message for the first process the OS killed in this job (``exec/hosting/guard.py`` records each),
    naming its ranks (``per_process`` in each); None when none was."""
    records = []
    for f in job.glob("rank*.died"):
        try:
            records.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    if not records:
        return None
    first = min(records, key=lambda r: r["time"])
    return killed_message(ranks_of(first["rank"], per_process), first["signal"])


def killed_message(who: str, sig: int) -> str:
    """The message for ``who`` (see ``ranks_of``), killed by signal ``sig``."""
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    cause = _CAUSES.get(sig, "ended by the operating system")
    return f"{who} killed by signal {sig} ({name}): {cause}"


def ranks_of(process: str, per_process: int) -> str:
    """'rank 3 was', or 'the process of ranks 2-3 was' (the guard knows its process's index)."""
    if per_process == 1 or not process.isdigit():
        return f"rank {process} was"
    first = int(process) * per_process
    return f"the process of ranks {first}-{first + per_process - 1} was"
