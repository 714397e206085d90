"""A job whose ranks all run as threads of one process here, in a child of the command that started
it: the command becomes a small waiter (``exec/guard.py --wait``) that reports the child's death by
a signal (the OOM killer's SIGKILL above all) in one message naming its ranks, as the launcher of an
MPI job does for its processes (``exec/launch.describe_deaths``). Such a job needs no MPI: its ranks
exchange in memory.

The waiter holds 6 MB (Pss), against 20 MB for mpiexec, its proxy, a guard and a launcher, and
13 MB for the forked command itself waiting (the child's writes to Python's pages make them its
own). The child has a process group of its own: a terminal's Ctrl-C reaches the waiter alone, which
hands it on once (were both to receive it, the child's clean-up would be interrupted a second time;
so would a SIGTERM that `timeout` sends to its process group).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from duckflock.exec.guard import die_with
from duckflock.exec.launch import killed_message, ranks_of

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def fork_job(ranks: int) -> None:
    """Returns in a child process only; this process becomes the child's waiter and exits with
    the child's exit code."""
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        os.setpgid(0, 0)
        # A background process group may not write to its terminal where `stty tostop` is set:
        # the child would stop at its first line of output. Ignoring SIGTTOU allows the writes.
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        die_with(parent)
        return
    for sig in _FORWARDED:  # until the waiter hands them on: inherited across exec, as ignored
        signal.signal(sig, signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    guard = str(Path(__file__).with_name("guard.py"))
    os.execv(sys.executable, [sys.executable, "-I", "-S", guard, "--wait", str(child), str(ranks)])


def report_death(ranks: int, sig: int) -> None:
    """In the waiter, once a signal killed the child: remove what the child could not, and say so."""
    from duckflock.cli.errors_out import print_error
    from duckflock.exec.budget import remove_orphaned_spill_dirs

    remove_orphaned_spill_dirs()
    print_error(killed_message(ranks_of("0", ranks), sig))
