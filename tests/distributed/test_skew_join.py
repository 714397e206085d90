"""Heavy-hitter join keys: a key holding half of the big side is spread over all ranks (the other
side's rows of it replicated), results equal DuckDB's, and every rank receives a fair share."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import duckflock
from duckflock.catalog import Catalog
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
    # Columns whose types change through Arrow (HUGEINT, DECIMAL(38,3), INTERVAL, TIMESTAMPTZ, ...).
    make_table(
        root,
        "big_typed",
        "SELECT i AS id, CASE WHEN i % 2 = 0 THEN 7 ELSE i % 4000 END AS k, "
        "i::HUGEINT * 1000000000000 AS h, (i / 7)::DECIMAL(38,3) AS d, to_seconds(i)::INTERVAL AS iv, "
        "make_time(1, 2, i % 60) AS t, {'a': i, 'b': [i, NULL]} AS st, "
        "'2020-01-01'::TIMESTAMPTZ + to_seconds(i) AS tz, CASE WHEN i % 5 = 0 THEN NULL ELSE 'x' || i END AS s "
        "FROM range(200000) t(i)",
        4,
        "hash",
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


def hot_rows_of_rank(root: Path, table: str, ranks: int) -> list[int]:
    """Rows of the hot key 7 in each rank's partitions of ``table``."""
    info = Catalog.load(root).table(table)
    con = duckdb.connect()
    counts = []
    for rank in range(ranks):
        files = [
            str(root / f) for p in info.partitions_of_rank(rank, ranks) for f in info.partitions[p].files
        ]
        sql = f"SELECT count(*) FROM read_parquet({files!r}) WHERE k = 7"
        counts.append(con.sql(sql).fetchall()[0][0] if files else 0)
    return counts


def left_in_duckdb(stats, xid: int) -> int:
    """Hot keys whose rows the spreading stage left in DuckDB, for the join's stage to read again."""
    notes = [s.note for s in stats if s.note.startswith(f"x{xid}:") and "left in DuckDB" in s.note]
    counts = {int(n.split("the rows of ")[1].split(" of them")[0]) for n in notes}
    assert len(counts) <= 1, notes  # every rank leaves the rows of the same keys
    return counts.pop() if counts else 0


def rows_joined(stats, xid: int, left: list[int]) -> list[int]:
    """The rows of the spread side each rank's join read: received, plus those ``left`` in DuckDB."""
    by_rank = {s.rank: s.received[xid] for s in stats if xid in s.received}
    return [by_rank[r] + left[r] for r in sorted(by_rank)]


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
        # Every rank produces key 7 alike (``big`` is hashed by id): its rows stay in DuckDB.
        assert left_in_duckdb(result.stats, xid) == 1
        joined = rows_joined(result.stats, xid, hot_rows_of_rank(data, "big", ranks))
        assert len(joined) == ranks and sum(joined) == 200_000
        assert max(joined) / (sum(joined) / ranks) < 1.5, joined


def kept_where_produced(stats, xid: int) -> int:
    """Rows of hot keys the ranks kept instead of dealing them (profile notes ``(N kept ...)``)."""
    notes = [s.note for s in stats if s.note.startswith(f"x{xid}:")]
    return sum(int(n.split("(")[1].split(" kept")[0].replace(",", "")) for n in notes)


@pytest.mark.parametrize("big", ["big", "big_u"])
def test_hot_key_stays_where_every_rank_produces_it(data, big):
    """``big`` (hashed by id) has every rank produce the hot key alike: its rows stay where they are,
    nothing of them crosses the network; a stage that only scans leaves them in DuckDB, and the
    join's stage reads them again. ``big_u`` has it on two ranks of three: dealt round-robin.
    Balanced and exact either way."""
    sql = INNER.replace("FROM big b", f"FROM {big} b")
    with duckflock.connect(str(data), ranks=3, config=SHUFFLE) as db:
        result = db.sql(sql, profile=True)
        assert_same(result.arrow(), oracle(data).sql(sql).to_arrow_table())
        xid = spread_xid(result.stats)
        left = left_in_duckdb(result.stats, xid)
        assert (left, kept_where_produced(result.stats, xid)) == ((1, 0) if big == "big" else (0, 0))
        joined = rows_joined(result.stats, xid, hot_rows_of_rank(data, big, 3) if left else [0] * 3)
        assert sum(joined) == 200_000 and max(joined) / (sum(joined) / 3) < 1.5, joined


def test_hot_key_kept_in_arrow_where_the_stage_cannot_run_again(data):
    """A spreading stage whose rows a second run could change (``random()`` in a filter, though one
    that keeps every row) keeps the rows of a hot key every rank produces as Arrow batches."""
    sql = INNER.replace("FROM big b", "FROM (SELECT * FROM big WHERE v >= random() - 1) b")
    with duckflock.connect(str(data), ranks=3, config=SHUFFLE) as db:
        result = db.sql(sql, profile=True)
        assert_same(result.arrow(), oracle(data).sql(sql).to_arrow_table())
        xid = spread_xid(result.stats)
        assert left_in_duckdb(result.stats, xid) == 0
        hot_rows = oracle(data).sql("SELECT count(*) FROM big WHERE k = 7").fetchall()[0][0]
        assert kept_where_produced(result.stats, xid) == hot_rows
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
        assert left_in_duckdb(result.stats, xid) == 1
        joined = rows_joined(result.stats, xid, hot_rows_of_rank(data, "big", 3))
        assert sum(joined) == 200_000 and max(joined) / (sum(joined) / 3) < 1.5, joined


@pytest.mark.parametrize("streamed", [False, True])
def test_rows_left_in_duckdb_read_as_received(data, streamed):
    """The join reads the rows of a hot key left in DuckDB beside the rows it receives, as the same
    types (those Arrow changes too), whether it reads the exchange whole or as a stream."""
    sql = (
        "SELECT count(*), sum(h), sum(d), max(iv), max(t), max(st), min(tz), count(b.s), max(b.s || s.s), "
        "list_sort(list(DISTINCT st.b[1]))[:3] FROM big_typed b JOIN small s ON b.k = s.k"
    )
    config = {**SHUFFLE, "stream_min_bytes": 0} if streamed else SHUFFLE
    with duckflock.connect(str(data), ranks=3, config=config) as db:
        result = db.sql(sql, profile=True)
        assert_same(result.arrow(), oracle(data).sql(sql).to_arrow_table())
        xid = spread_xid(result.stats)
        assert left_in_duckdb(result.stats, xid) == 1
        assert any(xid in s.streamed for s in result.stats) == streamed
