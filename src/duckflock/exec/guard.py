"""A rank's parent under mpiexec: notes how the rank died when the OS killed it.

When the kernel's OOM killer (or a signal) ends a rank, MPICH prints a banner naming whichever
process it noticed first, often not the one that was killed. So each rank runs as the child of this
small process, which sees the child's exit status: on death by a signal it writes
``<job dir>/rank<R>.died`` (R: the MPI process's rank, signal, time) for the launcher, which then
reports one duckflock message naming the rank (or the ranks that process ran as threads), the
signal and the likely cause (``exec.launch.describe_deaths``).

``python -I -S .../exec/guard.py JOB_DIR PROGRAM ARGS...`` — run by path and without ``site``, so
that it imports neither duckflock nor DuckDB: it only waits. One runs per process, so it imports as
little as it can (4 MB instead of 6 MB of its own memory): ``_signal``, not ``signal`` (which
loads ``enum``), and fork/exec/waitpid, not ``subprocess``.
"""

import _signal
import ctypes
import json
import os
import sys
import time

_PR_SET_PDEATHSIG = 1
_FORWARDED = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP)


def main(argv: list[str]) -> int:
    job, program = argv[0], argv[1:]
    rank = next((os.environ[v] for v in ("PMI_RANK", "PMIX_RANK", "SLURM_PROCID") if v in os.environ), "?")
    guard = os.getpid()
    child = os.fork()
    if child == 0:  # the rank; it inherits the launcher's descriptors (MPICH's PMI connection among them)
        try:
            if sys.platform.startswith("linux"):
                _die_with(guard)
            os.execv(program[0], program)
        except OSError as e:
            os.write(2, f"duckflock: cannot start rank {rank}: {e}\n".encode())
        os._exit(127)
    for sig in _FORWARDED:
        _signal.signal(sig, lambda s, _f: os.kill(child, s))
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    if code >= 0:
        return code
    record = {"rank": rank, "signal": -code, "time": time.time(), "pid": child}
    tmp = os.path.join(job, f".rank{rank}.died")
    with open(tmp, "w") as f:
        f.write(json.dumps(record))
    os.rename(tmp, os.path.join(job, f"rank{rank}.died"))
    # Die of the same signal: mpiexec tears the job down when a process is killed, but may wait
    # forever on the other ranks when one merely exits with an error code.
    if -code in _FORWARDED:
        _signal.signal(-code, _signal.SIG_DFL)  # the handler forwarding it to the child
    os.kill(os.getpid(), -code)
    return 128 - code


def _die_with(guard: int) -> None:
    """Make the rank die when this guard dies: orphaned, it would keep the job's PMI connection
    open, and mpiexec would wait for it forever. Linux's parent-death signal; the stdlib has no
    wrapper for prctl, hence ctypes."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(_signal.SIGKILL))
    if os.getppid() != guard:  # the guard died before the signal was armed
        os._exit(128 + _signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
