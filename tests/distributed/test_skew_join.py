"""Heavy-hitter join keys: a key holding half of the big side is spread over all ranks (the other
side's rows of it replicated), results equal DuckDB's, and every rank receives a fair share."""

from __future__ import annotations

from pathlib import Path

import pytest

import duckflock
from support import assert_same, make_table, oracle

pytestmark = pytest.mark.dist

SHUFFLE = {"broadcast_threshold_bytes": 0}
INNER = "SELECT count(*) AS n, sum(b.v) AS v, max(s.s) AS s FROM big b JOIN small s ON b.k = s.k"

# Kinds where spreading is exact (the big side spread, preserved at most) and kinds it must skip.
KINDS = {
    "left": "SELECT count(*) AS n, count(s.s) AS m, sum(b.v) AS v FROM big b LEFT JOIN small s ON b.k = s.k",
    "semi": "SELECT count(*) AS n, sum(v) AS v FROM big b WHERE EXISTS (SELECT 1 FROM small s WHERE s.k = b.k)",
    "anti": "SELECT count(*) AS n, sum(v) AS v FROM big b WHERE NOT EXISTS "
    "(SELECT 1 FROM small s WHERE s.k = b.k)",
    "right": "SELECT count(*) AS n, count(b.v) AS m, max(s.s) AS s FROM small s RIGHT JOIN big b ON b.k = s.k",
    "inner with residual": "SELECT count(*) AS n, sum(b.v) AS v FROM big b JOIN small s "
    "ON b.k = s.k AND b.v % 3 <> s.k % 2",
    "full": "SELECT count(*) AS n, count(b.v) AS m, count(s.s) AS c FROM big b FULL JOIN small s ON b.k = s.k",
    "small preserved": "SELECT count(*) AS n, count(b.v) AS m FROM small s LEFT JOIN big b ON b.k = s.k",
}
NOT_SPREAD = {"full", "small preserved"}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("skew")
    # Key 7 holds half of the 200k rows; the rest spread over 4,000 keys, some absent from ``small``.
    make_table(
        root,
        "big",
        "SELECT i AS id, CASE WHEN i % 2 = 0 THEN 7 ELSE i % 4000 END AS k, i AS v FROM range(200000) t(i)",
        4,
        "hash",
        ("id",),
    )
    # The hot key in the first half of the ids only, placed by ranges of id: some ranks hold none of it.
    make_table(
        root,
        "big_u",
        "SELECT i AS id, CASE WHEN i < 100000 THEN 7 ELSE i % 4000 END AS k, i AS v FROM range(200000) t(i)",
        4,
        "range",
        ("id",),
    )
    # Several rows of the hot key, and keys past the big side's.
    make_table(
        root,
        "small",
        "SELECT i % 5000 AS k, 's' || i::VARCHAR AS s FROM range(5003) t(i) WHERE i % 7 <> 3",
        3,
    )
    # The same rows placed by their key: only the big side moves (into this table's placement).
    make_table(
        root,
        "small_h",
        "SELECT i % 5000 AS k, 's' || i::VARCHAR AS s FROM range(5003) t(i) WHERE i % 7 <> 3",
        3,
        "hash",
        ("k",),
    )
    # ... and placed by ranges of the key (as TPC-H's part by p_partkey).
    make_table(
        root,
        "small_r",
        "SELECT i % 5000 AS k, 's' || i::VARCHAR AS s FROM range(5003) t(i) WHERE i % 7 <> 3",
        4,
        "range",
        ("k",),
    )
    return root


def spread_xid(stats) -> int:
    """The exchange whose hot keys were spread, from the profile notes (``x<id>: ...``)."""
    notes = {s.note for s in stats if "spread over all ranks" in s.note}
    assert len(notes) >= 1, [s.note for s in stats]
    return int(next(iter(notes)).split(":")[0][1:])


@pytest.mark.parametrize("transport", ["threads", "mpi"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_hot_key_spread_balanced_and_exact(data, ranks, transport):
    want = oracle(data).sql(INNER).to_arrow_table()
    with duckflock.connect(str(data), ranks=ranks, transport=transport, config=SHUFFLE) as db:
        result = db.sql(INNER, profile=True)
        assert_same(result.arrow(), want)
        xid = spread_xid(result.stats)
        hot = [s.note for s in result.stats if s.note.startswith(f"x{xid}:")]
        assert all(" 1 hot join keys" in n for n in hot), hot
        received = [s.received[xid] for s in result.stats if xid in s.received]
        assert len(received) == ranks and sum(received) == 200_000
        assert max(received) / (sum(received) / ranks) < 1.5, received


def kept_where_produced(stats, xid: int) -> int:
    """Rows of hot keys the ranks kept instead of dealing them (profile notes ``(N kept ...)``)."""
    notes = [s.note for s in stats if s.note.startswith(f"x{xid}:")]
    return sum(int(n.split("(")[1].split(" kept")[0].replace(",", "")) for n in notes)


@pytest.mark.parametrize("big", ["big", "big_u"])
def test_hot_key_stays_where_every_rank_produces_it(data, big):
    """``big`` (hashed by id) has every rank produce the hot key alike: its rows stay where they are,
    nothing of them crosses the network. ``big_u`` has it on two ranks of three: dealt round-robin.
    Balanced and exact either way."""
    sql = INNER.replace("FROM big b", f"FROM {big} b")
    with duckflock.connect(str(data), ranks=3, config=SHUFFLE) as db:
        result = db.sql(sql, profile=True)
        assert_same(result.arrow(), oracle(data).sql(sql).to_arrow_table())
        xid = spread_xid(result.stats)
        hot_rows = oracle(data).sql(f"SELECT count(*) FROM {big} WHERE k = 7").fetchall()[0][0]
        kept = kept_where_produced(result.stats, xid)
        assert kept == (hot_rows if big == "big" else 0), (kept, hot_rows)
        received = [s.received[xid] for s in result.stats if xid in s.received]
        assert sum(received) == 200_000 and max(received) / (sum(received) / 3) < 1.5, received


def test_without_skew_handling_one_rank_gets_the_hot_key(data):
    """The imbalance the spreading removes (and the same answer without it)."""
    want = oracle(data).sql(INNER).to_arrow_table()
    with duckflock.connect(str(data), ranks=3, config={**SHUFFLE, "skew_joins": False}) as db:
        result = db.sql(INNER, profile=True)
        assert_same(result.arrow(), want)
        received = [sum(s.received.values()) for s in result.stats if len(s.received) == 2]
        assert max(received) > 100_000, received


def test_join_kinds_exact(data):
    ref = oracle(data)
    with duckflock.connect(str(data), ranks=3, config=SHUFFLE) as db:
        for name, sql in KINDS.items():
            result = db.sql(sql, profile=True)
            assert_same(result.arrow(), ref.sql(sql).to_arrow_table())
            spread = any("spread over all ranks" in s.note for s in result.stats)
            assert spread == (name not in NOT_SPREAD), name


def test_output_not_taken_as_partitioned_by_the_key(data):
    """A hot key's joined rows are on every rank: grouping by the key must still bring them together."""
    sql = "SELECT b.k, count(*) AS n, max(s.s) AS s FROM big b JOIN small s ON b.k = s.k GROUP BY b.k"
    with duckflock.connect(str(data), ranks=3, config=SHUFFLE) as db:
        assert_same(db.sql(sql).arrow(), oracle(data).sql(sql).to_arrow_table())
        assert "hot keys spread over all ranks" in db.explain(sql)


@pytest.mark.parametrize("table", ["small_h", "small_r"])
@pytest.mark.parametrize("kind", ["JOIN", "LEFT JOIN"])
def test_hot_key_spread_when_only_the_big_side_moves(data, kind, table):
    """The side placed by the key (hashed or by ranges) stays on its ranks, except its rows of hot
    keys: sent to all."""
    sql = f"SELECT count(*) AS n, sum(b.v) AS v, max(s.s) AS s FROM big b {kind} {table} s ON b.k = s.k"
    with duckflock.connect(str(data), ranks=3, config=SHUFFLE) as db:
        assert "[shuffle left]" in db.explain(sql)
        result = db.sql(sql, profile=True)
        assert_same(result.arrow(), oracle(data).sql(sql).to_arrow_table())
        xid = spread_xid(result.stats)
        received = [s.received[xid] for s in result.stats if xid in s.received]
        assert sum(received) == 200_000 and max(received) / (sum(received) / 3) < 1.5, received
