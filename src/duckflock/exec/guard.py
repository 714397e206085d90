"""A rank's parent under mpiexec: notes how the rank died when the OS killed it.

When the kernel's OOM killer (or a signal) ends a rank, MPICH prints a banner naming whichever
process it noticed first, often not the one that was killed. So each rank runs as the child of this
small process, which sees the child's exit status: on death by a signal it writes
``<job dir>/rank<R>.died`` (rank, signal, time) for the launcher, which then reports one duckflock
message naming the rank, the signal and the likely cause (``describe_deaths``).

``python -I .../exec/guard.py JOB_DIR PROGRAM ARGS...`` — run by path, so that it imports neither
duckflock nor DuckDB: it only waits.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

_CAUSES = {
    signal.SIGKILL: "most likely the kernel's out-of-memory killer: the rank needed more memory than "
    "the node allows; give each rank less (DUCKFLOCK_MEMORY_LIMIT_BYTES), use fewer ranks per node or "
    "more nodes",
    signal.SIGSEGV: "a crash inside DuckDB or a native library",
    signal.SIGBUS: "a crash reading a memory-mapped file (a file changed or a disk filled up)",
    signal.SIGABRT: "an internal abort in a native library",
    signal.SIGTERM: "stopped from outside (a scheduler time limit, or kill)",
    signal.SIGINT: "interrupted (Ctrl-C)",
}


def main(argv: list[str]) -> int:
    job, program = Path(argv[0]), argv[1:]
    rank = next((os.environ[v] for v in ("PMI_RANK", "PMIX_RANK", "SLURM_PROCID") if v in os.environ), "?")
    # The rank inherits the launcher's descriptors (MPICH's PMI connection among them).
    arm = _die_with(os.getpid()) if sys.platform.startswith("linux") else None
    child = subprocess.Popen(program, close_fds=False, preexec_fn=arm)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    code = child.wait()
    if code >= 0:
        return code
    record = {"rank": rank, "signal": -code, "time": time.time(), "pid": child.pid}
    tmp = job / f".rank{rank}.died"
    tmp.write_text(json.dumps(record))
    tmp.rename(job / f"rank{rank}.died")
    # Die of the same signal: mpiexec tears the job down when a process is killed, but may wait
    # forever on the other ranks when one merely exits with an error code.
    if -code in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(-code, signal.SIG_DFL)  # the handler forwarding it to the child
    os.kill(os.getpid(), -code)
    return 128 - code


def _die_with(guard: int) -> Callable[[], None]:
    """The rank is killed when this guard dies: orphaned, it would keep the job's PMI connection
    open, and mpiexec would wait for it forever. Linux's parent-death signal; the stdlib has no
    wrapper for prctl, hence ctypes."""

    def arm() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL))
        if os.getppid() != guard:  # the guard died before the signal was armed
            os._exit(128 + signal.SIGKILL)

    return arm


_PR_SET_PDEATHSIG = 1


def describe_deaths(job: Path) -> str | None:
    """One message for the first rank the OS killed in this job, None when none was."""
    records = []
    for f in job.glob("rank*.died"):
        try:
            records.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    if not records:
        return None
    first = min(records, key=lambda r: r["time"])
    sig = first["signal"]
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    cause = _CAUSES.get(sig, "ended by the operating system")
    return f"rank {first['rank']} was killed by signal {sig} ({name}): {cause}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
