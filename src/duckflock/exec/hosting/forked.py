"""A job whose ranks all run as threads of one process here, in a child of the command that started
it: the command becomes a small waiter (``exec/hosting/guard.py --wait``) that reports the child's
death by a signal (the OOM killer's SIGKILL above all) in one message naming its ranks, as the
launcher of an MPI job does for its processes (``exec/hosting/launch.describe_deaths``). Such a job
needs no MPI: its ranks exchange in memory.

The waiter holds less memory than mpiexec, its proxy, a guard and a launcher together, and less than
the forked command itself would waiting (the child's writes to Python's pages make them its own).
The child has a process group of its own: a terminal's Ctrl-C reaches the waiter alone, which
hands it on (were both to receive it, the child would be interrupted twice at once; so would it by
a SIGTERM that `timeout` sends to its process group).

Ctrl-C, SIGTERM and SIGHUP stop the child as Ctrl-C stops a query of a session (the session's
waiting thread cancels the query on every rank, then raises KeyboardInterrupt) while its query
runs; anywhere else (starting up, printing, closing), and at a second signal, the child says
"interrupted" and exits at once: a KeyboardInterrupt raised inside DuckDB's calls there ends in
tracebacks, and what the child leaves (its spill directories) the waiter removes. Either way the
exit code is 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from duckflock.exec.hosting.guard import FORWARDED, die_with
from duckflock.exec.hosting.launch import killed_message, ranks_of

_interruptible = False  # a query runs: the session turns a KeyboardInterrupt into a clean stop
_interrupted_by: int | None = None  # the first signal's number
_in_child = False


def fork_job(ranks: int) -> None:
    """Returns in a child process only; this process becomes the child's waiter and exits with
    the child's exit code."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()  # not after the fork: both processes would write what is buffered
    # Blocked until each side handles them (the waiter once it runs: the mask survives exec), so
    # that none arriving meanwhile is lost or kills a process unannounced.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        global _in_child
        _in_child = True
        os.setpgid(0, 0)
        # A background process group may not write to its terminal where `stty tostop` is set:
        # the child would stop at its first line of output. Ignoring SIGTTOU allows the writes.
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        for sig in FORWARDED:
            signal.signal(sig, _interrupt)
        die_with(parent)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        return
    guard = str(Path(__file__).with_name("guard.py"))
    os.execv(sys.executable, [sys.executable, "-I", "-S", guard, "--wait", str(child), str(ranks)])


def exit_child(code: int) -> None:
    """In the child, once its job is over: run the exit handlers (spill directories), flush, and
    exit without the interpreter's teardown of every module and object, which with DuckDB, Arrow
    and sqlglot loaded is a noticeable part of a small query's time and leaves nothing behind.
    Elsewhere it returns."""
    if not _in_child:
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            if stream is not None:
                stream.flush()
    os._exit(code)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """In the child: while the block waits for a query, a first signal raises KeyboardInterrupt."""
    global _interruptible
    _interruptible = True
    try:
        yield
    finally:
        _interruptible = False


def note_interrupt(signum: int) -> bool:
    """Remember the signal that stops this command (the first one); whether it is the first."""
    global _interrupted_by
    first = _interrupted_by is None
    if first:
        _interrupted_by = signum
    return first


def interrupted_exit_code() -> int:
    """The exit code of a command stopped by a signal: 128 + its number (Ctrl-C's, if none came)."""
    return 128 + (_interrupted_by or signal.SIGINT)


def _interrupt(signum: int, frame: object) -> None:
    if note_interrupt(signum) and _interruptible:
        raise KeyboardInterrupt
    os.write(2, b"interrupted\n")
    os._exit(interrupted_exit_code())


def after_failure(ranks: int, sig: int | None) -> None:
    """In the waiter, once the child failed: remove its spill directories, which it could not
    when it exited at once or was killed, and name the signal that killed it (``sig``)."""
    from duckflock.exec.resources.budget import remove_orphaned_spill_dirs

    remove_orphaned_spill_dirs()
    if sig is not None:
        from duckflock.errors_out import print_error

        first = "0"  # the one process of the job: ranks 0 to ranks - 1
        print_error(killed_message(ranks_of(first, ranks), sig))
