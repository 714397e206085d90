"""Progress while a query runs: snapshots from the ranks' stage reports on every transport, and the
CLI's live line (on a terminal only)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from itertools import pairwise

import pytest

import duckflock
from duckflock.testing.tpch import query
from flight_support import Workers
from support import assert_same, oracle

pytestmark = pytest.mark.dist
JOIN = (
    "SELECT o_orderpriority, count(*) AS n, sum(l_quantity) AS q "
    "FROM orders JOIN lineitem ON o_orderkey = l_orderkey GROUP BY o_orderpriority"
)
NO_BROADCAST = {"broadcast_threshold_bytes": 0}  # shuffles both sides: more stages, more rows moved


def check_progress(snapshots: list[duckflock.Progress], result: duckflock.Result, ranks: int) -> None:
    stages = result.outcome.plan.stages
    assert len(stages) >= 3
    # One snapshot at the start and one per stage finished on a rank.
    assert len(snapshots) == 1 + sum(1 if s.on_driver else ranks for s in stages)
    first, last = snapshots[0], snapshots[-1]
    assert (first.done, first.rows, first.bytes) == (0, 0, 0) and first.running >= 1
    for a, b in pairwise(snapshots):
        assert b.done >= a.done and b.rows >= a.rows and b.bytes >= a.bytes
        assert a.stages == b.stages == len(stages)
    assert last.finished and last.done == len(stages) and last.running == 0
    assert all(not s.finished for s in snapshots[:-1])
    # The profile (every rank's stats) counts the same rows and bytes.
    assert last.rows == sum(st.exchange.rows_out for st in result.stats) > 0
    assert last.bytes == sum(st.exchange.bytes_out for st in result.stats) > 0


@pytest.mark.parametrize("transport", ["threads", "mpi"])
def test_progress_on_local_ranks(tpch_dir, transport):
    ref = oracle(tpch_dir)
    with duckflock.connect(str(tpch_dir), ranks=3, transport=transport, config=NO_BROADCAST) as db:
        for sql in (JOIN, query(3)):
            snapshots: list[duckflock.Progress] = []
            result = db.sql(sql, profile=True, progress=snapshots.append)
            check_progress(snapshots, result, 3)
            assert_same(result.arrow(), ref.sql(sql).to_arrow_table())
        assert db.sql(JOIN).arrow().num_rows == 5  # without a callback nothing changes


def test_progress_on_flight_workers(tpch_dir, tmp_path):
    with (
        Workers(tpch_dir, 2, tmp_path) as w,
        duckflock.connect(workers=w.addresses, token=w.token, config=NO_BROADCAST) as db,
    ):
        snapshots: list[duckflock.Progress] = []
        result = db.sql(JOIN, profile=True, progress=snapshots.append)
        check_progress(snapshots, result, 2)
        assert_same(result.arrow(), oracle(tpch_dir).sql(JOIN).to_arrow_table())


def test_a_failing_callback_fails_the_call_not_the_session(tpch_dir):
    def broken(_p: duckflock.Progress) -> None:
        raise RuntimeError("callback bug")

    with duckflock.connect(str(tpch_dir), ranks=2, transport="threads") as db:
        with pytest.raises(RuntimeError, match="callback bug"):
            db.sql(JOIN, progress=broken)
        assert db.sql(JOIN).arrow().num_rows == 5


def _cli_sql(tpch_dir, env: dict[str, str], **kwargs) -> subprocess.Popen:
    argv = [sys.executable, "-m", "duckflock.cli.main", "sql", "--data", str(tpch_dir), "--ranks", "2", JOIN]
    return subprocess.Popen(argv, env={**os.environ, **env}, text=True, **kwargs)


def test_cli_piped_output_has_no_progress(tpch_dir):
    proc = _cli_sql(tpch_dir, {}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert err == "" and "stages" not in out and "5 rows" in out


def test_cli_shows_progress_on_a_terminal_while_the_query_runs(tpch_dir, tmp_path):
    """The launcher's stderr is a terminal (told to the ranks as the launcher does); the query is held
    at the stage gate until the live line has appeared, then finishes with the line cleared."""
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "hold").touch()
    env = {"DUCKFLOCK_CLI_TERMINAL_WIDTH": "100", "DUCKFLOCK_STAGE_GATE_DIR": str(gate)}
    proc = _cli_sql(tpch_dir, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = threading.Event()
    err: list[str] = []

    def read_stderr() -> None:
        assert proc.stderr is not None
        while chunk := proc.stderr.read(1):
            err.append(chunk)
            if "stages 0/" in "".join(err[-200:]):
                seen.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert seen.wait(120), "".join(err)
    finally:
        (gate / "hold").unlink()
    out = proc.stdout.read() if proc.stdout else ""
    assert proc.wait(timeout=120) == 0, "".join(err)
    reader.join(30)
    assert "5 rows" in out and "stages" not in out
