"""Bounded memory: with a tiny budget, received exchange data spills to local files and queries still
give DuckDB's answer; spill files never outlive their stage, also when the query fails."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import duckflock
from support import assert_same, make_table, oracle

pytestmark = pytest.mark.dist

# Each rank may hold 128 MB; received exchange data past 4 MB per stage goes to files.
TIGHT = {
    "memory_limit_bytes": 128 << 20,
    "exchange_memory_bytes": 4 << 20,
    "broadcast_threshold_bytes": 0,
    "range_sort_threshold_bytes": 0,
}

QUERIES = {
    "shuffle join": "SELECT count(*) AS n, max(f.s || d.s) AS m FROM f JOIN d ON f.k2 = d.k2",
    "aggregate": "SELECT k2, count(*) AS n, max(s) AS m, sum(v) AS v FROM f GROUP BY k2",
    "distinct": "SELECT count(DISTINCT s) AS n FROM f",
    "window": "SELECT k2 % 7 AS p, max(rn) AS r, min(s) AS s FROM "
    "(SELECT k2, s, row_number() OVER (PARTITION BY k2 % 7 ORDER BY s, v) AS rn FROM f) GROUP BY 1",
    "sort": "SELECT s, v FROM f WHERE v % 10 = 0 ORDER BY s, v",
    "skewed join": "SELECT count(*) AS n, sum(f.v) AS v, max(d.s) AS s FROM f JOIN d ON f.hot = d.k2",
    # A FULL join cannot spread its hot key over the ranks (plan/skew.py): one rank gets half of f.
    "skewed full join": "SELECT count(*) AS n, sum(f.v) AS v, max(f.s || d.s) AS s FROM f FULL JOIN d "
    "ON f.hot = d.k2",
}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("spill")
    # About 30 MB of strings: several times the exchange budget of a stage on 2 ranks.
    make_table(
        root,
        "f",
        "SELECT i AS k, (i * 7919) % 50000 AS k2, i AS v, CASE WHEN i % 2 = 0 THEN 0 ELSE i % 1000 END AS hot, "
        "repeat(chr(CAST(65 + i % 26 AS INTEGER)), 20) || i::VARCHAR AS s FROM range(400000) t(i)",
        4,
        "hash",
        ("k",),
    )
    make_table(root, "d", "SELECT i AS k2, 'd' || i::VARCHAR AS s FROM range(50000) t(i)", 3)
    return root


def spill_files(base: Path) -> list[Path]:
    return [p for p in base.rglob("*") if p.is_file()]


@pytest.mark.parametrize("transport", ["threads", "mpi"])
def test_queries_spill_and_match_duckdb(data, tmp_path, transport):
    base = tmp_path / "scratch"
    ref = oracle(data)
    config = {**TIGHT, "temp_dir": str(base)}
    spilled, spread = {}, set()
    with duckflock.connect(str(data), ranks=2, transport=transport, config=config) as db:
        for name, sql in QUERIES.items():
            result = db.sql(sql, profile=True)
            order = ["s", "v"] if name == "sort" else None
            assert_same(result.arrow(), ref.sql(sql).to_arrow_table(), order_by=order)
            spilled[name] = sum(s.exchange.bytes_spilled for s in result.stats)
            spread |= {name for s in result.stats if "spread over all ranks" in s.note}
            assert not spill_files(base), f"{name}: files left after the query"
    # Inputs that exceed the budget (partial aggregates and the filtered sort stay under it; the
    # skewed inner join's hot key is spread over the ranks).
    assert all(spilled[q] > 0 for q in ("shuffle join", "distinct", "window", "skewed full join")), spilled
    assert spread == {"skewed join"}, spread
    assert not list(base.glob("duckflock-*")), "spill directories left after the session"


def test_failed_query_leaves_no_spill_files(data, tmp_path):
    base = tmp_path / "scratch"
    config = {**TIGHT, "temp_dir": str(base)}
    with duckflock.connect(str(data), ranks=2, transport="threads", config=config) as db:
        # Fails after the join's inputs were received (and spilled): 'A…' is not an integer.
        with pytest.raises(duckflock.ExecutionError, match="Conversion"):
            db.sql("SELECT sum(CAST(f.s AS INTEGER)) FROM f JOIN d ON f.k2 = d.k2").arrow()
        # The driver reports the failure while other ranks may still be ending the query: each
        # removes its files as it does (bounded wait for a condition, not a timed guess).
        deadline = time.monotonic() + 30
        while spill_files(base) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not spill_files(base)
        assert db.sql("SELECT count(*) FROM f").fetchall() == [(400000,)]  # the session still works
    assert not list(base.glob("duckflock-*"))


def test_orphaned_spill_directory_is_removed(data, tmp_path):
    """A pid that cannot exist: a rank killed earlier on this host; its directory goes. One of
    another host (a temp_dir the nodes share) is left to that host."""
    import socket

    base = tmp_path / "scratch"
    dead = base / f"duckflock-999999999-r0-{socket.gethostname()}-abc"
    elsewhere = base / "duckflock-999999999-r0-another.host-abc"
    suffixed = base / f"duckflock-999999999-r0-gpu-{socket.gethostname()}-abc"  # host gpu-<ours>
    for d in (dead, elsewhere, suffixed):
        (d / "duckdb").mkdir(parents=True)
        (d / "exchange-1.arrow").write_bytes(b"x" * 100)
    with duckflock.connect(str(data), ranks=1, transport="threads", config={"temp_dir": str(base)}) as db:
        db.sql("SELECT 1").arrow()
        assert not dead.exists() and elsewhere.exists() and suffixed.exists()
