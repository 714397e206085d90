"""The small process that waits on a process of ranks and says how it died when the OS killed it.

When the kernel's OOM killer (or a signal) ends a rank, MPICH prints a banner naming whichever
process it noticed first, often not the one that was killed; a process killed on its own leaves
just "Killed" from the shell. So the ranks run as the child of this process, which sees the child's
exit status. Two uses:

- ``guard.py JOB_DIR PROGRAM ARGS...``: each process of an MPI job runs under one (mpiexec starts
  it). On death by a signal it writes ``<job dir>/rank<R>.died`` (R: the MPI process's rank, signal,
  time) for the launcher, which then reports one duckflock message naming the rank (or the ranks
  that process ran as threads), the signal and the likely cause (``exec.hosting.launch.describe_deaths``).
- ``guard.py --wait CHILD RANKS``: the CLI becomes this after forking the child that runs all the
  job's ranks as threads (``exec/hosting/forked.py``), and reports a death itself.

``python -I -S .../exec/hosting/guard.py ...`` — run by path and without ``site``, so that it imports
neither duckflock nor DuckDB while it waits. It imports as little as it can, to hold little memory
of its own: ``_signal``, not ``signal`` (which loads ``enum``), and fork/exec/waitpid, not
``subprocess``.
"""

import _signal
import os
import sys
import time

_PR_SET_PDEATHSIG = 1
FORWARDED = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP)


def main(argv: list[str]) -> int:
    if argv[0] == "--wait":
        return _wait_for(int(argv[1]), int(argv[2]))
    job, program = argv[0], argv[1:]
    names = ("PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "DUCKFLOCK_STORAGE_RANK")
    rank = next((os.environ[v] for v in names if v in os.environ), "?")
    guard = os.getpid()
    child = os.fork()
    if child == 0:  # the rank; it inherits the launcher's descriptors (MPICH's PMI connection among them)
        try:
            die_with(guard)
            os.execv(program[0], program)
        except OSError as e:
            os.write(2, f"duckflock: cannot start rank {rank}: {e}\n".encode())
        os._exit(127)
    code = _exit_code(child)
    if code >= 0:
        return code
    import json

    record = {"rank": rank, "signal": -code, "time": time.time(), "pid": child}
    tmp = os.path.join(job, f".rank{rank}.died")
    with open(tmp, "w") as f:
        f.write(json.dumps(record))
    os.rename(tmp, os.path.join(job, f"rank{rank}.died"))
    # Die of the same signal: mpiexec tears the job down when a process is killed, but may wait
    # forever on the other ranks when one merely exits with an error code.
    if -code in FORWARDED:
        _signal.signal(-code, _signal.SIG_DFL)  # the handler forwarding it to the child
    os.kill(os.getpid(), -code)
    return 128 - code


def _wait_for(child: int, ranks: int) -> int:
    """The child's exit code. When it failed, what it could not remove is removed; when a signal
    killed it, one message says so, and 128 + the signal is returned (duckflock's own modules, and
    the site-packages -S left out, are loaded only then). The child has a process group of its own,
    which the terminal's Ctrl-Z does not reach: it stops with this process, and goes on with it."""
    _signal.signal(_signal.SIGTSTP, lambda _s, _f: _pause(child))
    _signal.signal(_signal.SIGCONT, lambda _s, _f: _send(child, _signal.SIGCONT))
    code = _exit_code(child)
    if code == 0:
        return code
    import site

    site.main()
    src = os.path.abspath(__file__)  # src/duckflock/exec/hosting/guard.py
    for _ in range(4):
        src = os.path.dirname(src)
    sys.path.insert(0, src)
    from duckflock.exec.hosting.forked import after_failure

    after_failure(ranks, -code if code < 0 else None)
    return code if code > 0 else 128 - code


def _exit_code(child: int) -> int:
    """Wait for ``child``, handing it the signals this process gets (blocked, when exec/hosting/forked.py
    started this process, until they are); its exit code (-N: signal N)."""
    for sig in FORWARDED:
        _signal.signal(sig, lambda s, _f: _send(child, s))
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, FORWARDED)
    return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])


def _pause(child: int) -> None:
    """Stop the child, then this process. SIGSTOP, not the terminal's SIGTSTP: in a process group
    whose parent is gone (a job its shell left) the kernel drops a SIGTSTP with its default action."""
    _send(child, _signal.SIGSTOP)
    os.kill(os.getpid(), _signal.SIGSTOP)  # returns once continued


def _send(child: int, sig: int) -> None:
    try:  # noqa: SIM105 (contextlib would import functools and collections into the guard)
        os.kill(child, sig)
    except ProcessLookupError:  # it has just ended: waitpid returns
        pass


def die_with(guard: int) -> None:
    """Make this process (a rank) die when ``guard`` dies: orphaned, it would keep the job's PMI
    connection open, and mpiexec would wait for it forever (or it would compute for no one).
    Linux's parent-death signal (elsewhere nothing); the stdlib has no wrapper for prctl, hence
    ctypes."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(_signal.SIGKILL))
    if os.getppid() != guard:  # the guard died before the signal was armed
        os._exit(128 + _signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
