"""What the CLI says on stderr beside its results: a warning when the ranks far outnumber the cores."""

from __future__ import annotations

import os
import subprocess
import sys

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
