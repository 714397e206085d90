"""The launcher of a storage job (``backends/storage_job.py``): mpiexec's part for ranks that share
no network. ``storage_launch.py JOB_DIR RANKS PROGRAM ARGS...`` starts RANKS processes of PROGRAM,
each under ``exec/hosting/guard.py`` (which records a death by a signal in JOB_DIR, as for an MPI job) and
told its rank in DUCKFLOCK_STORAGE_RANK, and waits. When one ends in failure the others are killed
(their guards by SIGKILL, the ranks by their parent-death signal: a SIGTERM would be recorded as
their own death and blamed), ``rank<R>.exited`` holds its exit code, and this process exits with
it; a SIGTERM, SIGINT or SIGHUP here ends them all alike.

Run by path with ``python -I -S``, as the guard is: it imports nothing of duckflock, DuckDB or
Arrow while it waits.
"""

import _signal
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
RANK_ENV = "DUCKFLOCK_STORAGE_RANK"  # exec/hosting/launch.STORAGE_RANK_ENV


def main(argv: list[str]) -> int:
    job, ranks, program = argv[0], int(argv[1]), argv[2:]
    sys.path.insert(0, _HERE)
    from guard import die_with

    me = os.getpid()
    guard = [sys.executable, "-I", "-S", os.path.join(_HERE, "guard.py"), job, *program]
    pids: dict[int, int] = {}
    for rank in range(ranks):
        pid = os.fork()
        if pid == 0:
            try:
                die_with(me)
                os.execve(guard[0], guard, {**os.environ, RANK_ENV: str(rank)})
            except OSError as e:
                os.write(2, f"duckflock: cannot start rank {rank}: {e}\n".encode())
            os._exit(127)
        pids[pid] = rank

    def end_all(signum: int, _frame: object) -> None:
        for pid in pids:
            _kill(pid)
        os._exit(128 + signum)

    for sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(sig, end_all)
    code = 0
    while pids:
        pid, status = os.wait()
        rank = pids.pop(pid)
        ended = os.waitstatus_to_exitcode(status)
        if ended and not code:
            code = ended if ended > 0 else 128 - ended
            with open(os.path.join(job, f"rank{rank}.exited"), "w") as f:
                f.write(str(code))
            for other in pids:
                _kill(other)
    return code


def _kill(pid: int) -> None:
    try:  # noqa: SIM105 (contextlib would import more into the launcher)
        os.kill(pid, _signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
