"""A stage reading an exchange while its producer still runs (plan/streaming.py): DuckDB's answer,
spilled past the budget into files that are gone afterwards, and a producer failing mid-stream ends
the query with one message naming the rank (bounded in time: a hang fails the test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import duckflock
from support import assert_same, make_table, oracle

pytestmark = pytest.mark.dist
BOUND_S = 90

# No received batch fits the exchange budget: every one goes through a spill file, whatever the
# timing (a consumer that keeps up would otherwise leave nothing waiting to spill).
# Streams of any size (these tables are small).
TIGHT = {
    "memory_limit_bytes": 2 << 30,
    "exchange_memory_bytes": 1,
    "broadcast_threshold_bytes": 0,
    "stream_min_bytes": 0,
}

# The large side f is sent to where d's ranges of k2 live (as TPC-H's lineitem to partsupp); the
# join stage reads it as a stream, through one join (built on d) or two (built on d and the
# replicated e). A final aggregate streams its partial aggregates.
QUERIES = {
    "join": "SELECT count(*) AS n, max(f.s || d.s) AS m FROM f JOIN d ON f.k2 = d.k2",
    "two joins": "SELECT d.k2 % 5 AS g, count(*) AS n, sum(f.v) AS v FROM f JOIN d ON f.k2 = d.k2 "
    "JOIN e ON f.k2 % 100 = e.k GROUP BY 1",
    "left join": "SELECT count(*) AS n, count(d.s) AS m FROM f LEFT JOIN d ON f.k2 = d.k2 AND d.k2 % 2 = 0",
    "semi join": "SELECT count(*) AS n FROM f SEMI JOIN d ON f.k2 = d.k2 AND d.s LIKE '%7'",
    "aggregate": "SELECT k2 % 1000 AS g, count(*) AS n, max(s) AS m FROM f GROUP BY 1",
    # Both sides hashed on the join key, hot keys looked for: d's stage runs while f still streams.
    "both sides shuffled": "SELECT count(*) AS n, max(f.s || h.s) AS m FROM f JOIN h ON f.v % 40000 = h.k",
}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("streamed")
    make_table(
        root,
        "f",
        "SELECT i AS k, (i * 7919) % 50000 AS k2, i AS v, "
        "CASE WHEN i = 123457 THEN 'oops' ELSE repeat('x', 20) || i::VARCHAR END AS s "
        "FROM range(400000) t(i)",
        4,
        "hash",
        ("k",),
    )
    make_table(
        root, "d", "SELECT i AS k2, 'd' || i::VARCHAR AS s FROM range(50000) t(i)", 4, "range", ("k2",)
    )
    make_table(root, "e", "SELECT i AS k FROM range(100) t(i)", 2)
    make_table(root, "h", "SELECT i AS k, 'h' || i::VARCHAR AS s FROM range(50000) t(i)", 3)
    return root


@pytest.mark.parametrize("transport", ["threads", "mpi"])
def test_streamed_inputs_match_duckdb_and_spill(data, tmp_path, transport):
    base = tmp_path / "scratch"
    ref = oracle(data)
    with duckflock.connect(
        str(data), ranks=2, transport=transport, config={**TIGHT, "temp_dir": str(base)}
    ) as db:
        spilled = {}
        for name, sql in QUERIES.items():
            result = db.sql(sql, profile=True)
            assert_same(result.arrow(), ref.sql(sql).to_arrow_table())
            streaming = [s for s in result.stats if s.streamed]
            assert streaming, f"{name}: no stage streamed its input"
            spilled[name] = sum(s.exchange.bytes_spilled for s in streaming)
            assert not [p for p in base.rglob("*") if p.is_file()], f"{name}: files left after the query"
    assert all(spilled.values()), spilled


@pytest.mark.parametrize("transport", ["threads", "mpi"])
def test_streams_stay_in_memory_where_the_budget_has_room(data, tmp_path, transport):
    """With the budget derived from the node's memory (a rank's share of 2 GiB here: about 180 MB for
    received data), the streamed f (about 7 MB a rank, more than the fixed 4 MiB per rank streams
    kept before) is never spilled, and the profile counts it as kept in memory."""
    base = tmp_path / "scratch"
    config = {**TIGHT, "temp_dir": str(base)}
    del config["exchange_memory_bytes"]
    ref = oracle(data)
    with duckflock.connect(str(data), ranks=2, transport=transport, config=config) as db:
        for name in ("join", "both sides shuffled"):
            result = db.sql(QUERIES[name], profile=True)
            assert_same(result.arrow(), ref.sql(QUERIES[name]).to_arrow_table())
            assert any(s.streamed for s in result.stats), name
            assert sum(s.exchange.bytes_spilled for s in result.stats) == 0, name
            for rank in (0, 1):
                assert sum(s.exchange.bytes_kept for s in result.stats if s.rank == rank) > 0, (name, rank)


def test_producer_failing_mid_stream_ends_the_query(data):
    """The row that cannot be cast is in the middle of f: the join stage is streaming by then."""
    sql = "SELECT count(*) FROM f JOIN d ON CAST(substr(f.s, 21) AS BIGINT) % 50000 = d.k2"
    config = {"broadcast_threshold_bytes": 0, "stream_min_bytes": 0}
    with duckflock.connect(
        str(data), ranks=2, transport="threads", config=config
    ) as db:  # same plan, succeeding
        stats = db.sql(sql.replace("CAST(", "TRY_CAST("), profile=True).stats
        assert any(s.streamed for s in stats)
    proc = subprocess.run(
        [sys.executable, "-m", "duckflock.cli.main", "sql", "--data", str(data), "--ranks", "2", sql],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        env={**os.environ, "DUCKFLOCK_BROADCAST_THRESHOLD_BYTES": "0", "DUCKFLOCK_STREAM_MIN_BYTES": "0"},
    )
    assert proc.returncode != 0
    assert "Conversion Error: Could not convert" in proc.stderr and "rank " in proc.stderr
    assert "Traceback" not in proc.stderr and "OSError" not in proc.stderr
    assert proc.stderr.count("error:") == 1, proc.stderr


@pytest.mark.parametrize("transport", ["threads", "mpi"])
def test_a_stream_smaller_than_its_build_side_is_taken_whole(data, tmp_path, transport):
    """f filtered down to 400 rows never outgrows d's rows on a rank: the join stage takes it whole
    (from its spill files, memory-mapped) and DuckDB plans as usual."""
    sql = "SELECT count(*) AS n, max(f.s || d.s) AS m FROM f JOIN d ON f.k2 = d.k2 WHERE f.v % 1000 = 0"
    base = tmp_path / "scratch"
    with duckflock.connect(
        str(data), ranks=2, transport=transport, config={**TIGHT, "temp_dir": str(base)}
    ) as db:
        result = db.sql(sql, profile=True)
        assert_same(result.arrow(), oracle(data).sql(sql).to_arrow_table())
        assert not any(s.streamed for s in result.stats)
        assert sum(s.exchange.bytes_spilled for s in result.stats) > 0
        assert not [p for p in base.rglob("*") if p.is_file()]


@pytest.mark.parametrize("transport", ["threads", "mpi"])
def test_a_session_goes_on_after_queries_failing_mid_stream(tmp_path, transport):
    """A stage that failed while DuckDB streamed its rows (orders sent into customer's partitions,
    hot keys looked for, the last order failing) left that result open on its connection: the
    session's next queries failed with 'connection has an open result' or 'Interrupted'."""
    from duckflock.ingest.tpch import generate_tpch

    generate_tpch(0.1, tmp_path, parts=4, progress=False)
    bad = (
        "SELECT c_custkey, o_orderkey FROM customer JOIN orders ON c_custkey = o_custkey "
        "WHERE (CASE WHEN o_orderkey = 599975 THEN CAST('x' AS INT) ELSE 1 END) = 1"
    )
    good = "SELECT count(*) FROM orders JOIN lineitem ON o_orderkey = l_orderkey"
    want = oracle(tmp_path).sql(good).to_arrow_table()
    config = {**TIGHT, "exchange_memory_bytes": 1 << 20, "broadcast_max_bytes": -1, "skew_min_rows": 1000}
    with duckflock.connect(str(tmp_path), ranks=2, transport=transport, config=config) as db:
        for _ in range(4):
            with pytest.raises(duckflock.ExecutionError, match="Could not convert"):
                db.sql(bad)
            assert_same(db.sql(good).arrow(), want)
