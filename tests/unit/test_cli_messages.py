"""What the CLI says on stderr beside its results: a warning when the ranks far outnumber the cores;
datagen's progress bar, on a terminal only."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import pytest

from duckflock.testing.tables import make_table

# The CLI in a process allowed one core (its ranks inherit that), whatever the machine has.
ON_ONE_CORE = (
    "import os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
    "from duckflock.cli.main import main; sys.exit(main())"
)


def _cli_on_one_core(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", ON_ONE_CORE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ,
    )


@pytest.mark.parametrize(("ranks", "warned"), [(4, False), (5, True)])
def test_ranks_far_beyond_the_cores_are_warned_of_and_run(tmp_path, ranks, warned):
    make_table(tmp_path, "t", "SELECT i AS k FROM range(100) t(i)", 4)
    proc = _cli_on_one_core(
        "sql", "--data", str(tmp_path), "--ranks", str(ranks), "SELECT sum(k) AS s FROM t"
    )
    assert proc.returncode == 0 and "4950" in proc.stdout, proc.stderr
    if warned:
        assert proc.stderr.startswith("warning: 5 ranks on 1 core: each rank gets a fraction of a core")
        assert proc.stderr.count("\n") == 1, proc.stderr
    else:
        assert proc.stderr == ""


def _on_a_terminal(*args: str) -> tuple[int, str]:
    """The CLI with stdout and stderr on a pseudo-terminal: its exit code and what it showed there."""
    master, slave = os.openpty()
    cmd = [sys.executable, "-m", "duckflock.cli.main", *args]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    shown = b""
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 1.0)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the CLI ended and closed the terminal
                    break
                if not chunk:
                    break
                shown += chunk
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
    return proc.wait(timeout=60), shown.decode(errors="replace")


@pytest.mark.slow
def test_datagen_shows_its_parts_on_a_terminal_and_nothing_when_piped(tmp_path):
    args = ("datagen", "tpch", "--sf", "0.01", "--parts", "2", "--out")
    code, shown = _on_a_terminal(*args, str(tmp_path / "tty"))
    assert code == 0 and "tpchgen sf=0.01" in shown and "3/3" in shown, shown
    piped = subprocess.run(
        [sys.executable, "-m", "duckflock.cli.main", *args, str(tmp_path / "piped")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (piped.returncode, piped.stdout, piped.stderr) == (0, "", "")
