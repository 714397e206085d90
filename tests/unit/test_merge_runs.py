"""The driver's merge of the ranks' sorted runs (exec/stages/merge_runs.py) orders rows as single-process
DuckDB's ORDER BY does: NULLs, NaN, infinities, duplicates, empty runs, 1-4 runs, every key type it
takes; keys it does not take are left to DuckDB (None)."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from duckflock.exec.stages.merge_runs import merge, merge_order
from support import assert_same

# (DuckDB type, SQL of values with NULLs and duplicates) per key type the merge takes
TYPED_VALUES = {
    "INTEGER": "[3, NULL, -7, 3, 0, 2147483647, -2147483648, NULL, 5]",
    "BIGINT": "[9223372036854775807, -9223372036854775808, 0, NULL, 0, -1]",
    "UTINYINT": "[255, 0, 7, NULL, 7]",
    "DOUBLE": "['nan'::DOUBLE, 'inf', '-inf', -0.0, 0.0, NULL, 1.5, 'nan', -2.25, NULL]",
    "FLOAT": "['nan'::FLOAT, 1, NULL, -1, 'inf']",
    "DATE": "['1995-03-15'::DATE, '1970-01-01', NULL, '2024-02-29', '1995-03-15', '0001-01-01']",
    "TIMESTAMP": "['2020-01-01 10:00'::TIMESTAMP, NULL, '1960-05-05 01:02:03.5', '2020-01-01 10:00']",
    "TIMESTAMPTZ": "['2020-01-01 10:00+02'::TIMESTAMPTZ, NULL, '2020-01-01 09:00+00']",
    "TIME": "['10:00'::TIME, NULL, '00:00:01', '23:59:59.999']",
    "DECIMAL(12,2)": "[1.25, -1.25, NULL, 9999999999.99, -9999999999.99, 0, 1.25]",
    "DECIMAL(18,3)": "[123456789012345.678, -0.001, NULL, 0.001]",
    "BOOLEAN": "[true, NULL, false, true, false]",
}
ORDERS = ["ASC", "DESC", "ASC NULLS FIRST", "DESC NULLS FIRST", "DESC NULLS LAST"]


def runs_of(con: duckdb.DuckDBPyConnection, key_type: str, values: str, runs: int, order: str) -> pa.Table:
    """The rows cut into ``runs`` parts (some empty), each sorted by DuckDB, concatenated in order:
    what the driver receives from that many ranks."""
    con.execute(
        f"CREATE OR REPLACE TABLE t AS SELECT unnest({values} || {values})::{key_type} AS k, "
        "range AS id FROM range(2 * len(" + values + "))"
    )
    parts = [
        con.sql(
            f'SELECT k AS "key", id FROM t WHERE id % {runs + 1} = {r} ORDER BY "key" {order}'
        ).to_arrow_table()
        for r in range(runs)  # the rows with id % (runs + 1) == runs go nowhere: run sizes differ
    ]
    empty = con.sql('SELECT k AS "key", id FROM t WHERE false').to_arrow_table()
    return pa.concat_tables([empty, *parts, empty])


@pytest.mark.parametrize("runs", [1, 2, 3, 4])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("key_type", list(TYPED_VALUES))
def test_merged_runs_are_in_duckdbs_order(key_type, order, runs):
    con = duckdb.connect()
    table = runs_of(con, key_type, TYPED_VALUES[key_type], runs, order)
    got = merge(table, (f'"key" {order}',), ("key", "id"))
    assert got is not None
    con.register("got_rows", table)
    want = con.sql(f'SELECT "key", id FROM got_rows ORDER BY "key" {order}').to_arrow_table()
    assert_same(got, want, ["key"])


def test_unsorted_input_is_still_ordered_correctly():
    """Runs make the merge fast; its result never depends on them."""
    values = np.random.default_rng(3).integers(-50, 50, 10_000)
    table = pa.table({"k": pa.array(values, mask=values % 7 == 0)})
    order = merge_order(table, ('"k" DESC NULLS FIRST',))
    assert order is not None
    got = table.take(order)["k"]
    nulls = got.null_count
    assert got.slice(0, nulls).null_count == nulls
    rest = got.slice(nulls).to_numpy()
    assert (np.diff(rest) <= 0).all()


@pytest.mark.parametrize(
    "keys",
    [
        ('"k"', '"s"'),  # several keys
        ('"s"',),  # text
        ('"k" + 1',),  # an expression
        ('"missing"',),
        ('"big"',),  # a decimal wider than int64
        ('"i"',),  # an interval
    ],
)
def test_keys_it_does_not_merge_are_left_to_duckdb(keys):
    table = duckdb.sql(
        "SELECT 1 AS k, 'x' AS s, 12345678901234567890.5::DECIMAL(38,1) AS big, INTERVAL 1 DAY AS i"
    ).to_arrow_table()
    assert merge_order(table, keys) is None


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """t: NULL and duplicate keys of several types, 5 partitions of which some hold no rows; u: a
    table of no rows at all."""
    from duckflock.testing.tables import make_table

    root = tmp_path_factory.mktemp("merge-data")
    rows = (
        "SELECT CASE WHEN i % 11 = 0 THEN NULL ELSE (i * 7919) % 37 END AS k, "
        "CASE WHEN i % 13 = 0 THEN NULL WHEN i % 17 = 0 THEN 'nan'::DOUBLE ELSE (i % 29) / 4 END AS f, "
        "DATE '2000-01-01' + (i % 23)::INTEGER AS d, 'row ' || i AS s, i "
        "FROM range(2000) r(i) WHERE i < 300 OR i > 1700"
    )
    make_table(root, "t", rows, 5, "range", ("i",))
    make_table(root, "u", "SELECT 1 AS k, 'x' AS s WHERE false", 2)
    return root


MERGED_QUERIES = [
    ('SELECT k, s FROM t ORDER BY k', ["k"]),
    ('SELECT k, s FROM t ORDER BY k DESC NULLS FIRST', ["k"]),
    ('SELECT k, s FROM t WHERE i < 100 ORDER BY k DESC', ["k"]),  # rows on the first partition only
    ('SELECT f, i FROM t ORDER BY f DESC', ["f"]),
    ('SELECT f, i FROM t ORDER BY f NULLS FIRST', ["f"]),
    ('SELECT s, d FROM t ORDER BY d DESC', ["d"]),
    ('SELECT s FROM t ORDER BY i % 7', None),  # a hidden key column, not among the outputs
    ('SELECT t.k, t.s, u.s AS us FROM t JOIN u ON t.k = u.k ORDER BY t.k', ["k"]),  # no rows
    ('SELECT k, count(*) AS n FROM t GROUP BY k ORDER BY k NULLS FIRST', ["k"]),
]  # fmt: skip


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_order_by_results_equal_duckdbs_on_1_to_4_ranks(data, ranks):
    import duckflock
    from support import oracle

    ref = oracle(data)
    config = {"merge_sort_in_process": True}  # else the driver sorts where all ranks are its threads
    with duckflock.connect(str(data), ranks=ranks, transport="threads", config=config) as db:
        for query, order in MERGED_QUERIES:
            result = db.sql(query, profile=True)
            assert_same(result.arrow(), ref.sql(query).to_arrow_table(), order)
            merged = any("merged the ranks' sorted runs" in s.note for s in result.stats)
            assert merged == (ranks > 1), query
        # An OFFSET without LIMIT: sorted on the driver as before.
        query = "SELECT i, s FROM t ORDER BY i DESC OFFSET 5"
        assert_same(db.sql(query).arrow(), ref.sql(query).to_arrow_table(), ["i"])


@pytest.mark.parametrize("decimal", [pa.decimal32(7, 2), pa.decimal64(15, 3), pa.decimal256(18, 1)])
def test_decimals_of_every_width_merge_exactly(decimal):
    """Sliced (a non-zero offset), with a NULL and values one unit apart."""
    import decimal as dec

    values = [dec.Decimal(v) for v in ("0.5", "-0.5", "0.4", "-99999.9", "99999.9", "0.5")]
    runs = [sorted(values[:3], reverse=True), sorted(values[3:], reverse=True)]
    column = pa.array([None, *runs[0], *runs[1]], decimal).slice(1)
    table = pa.table({"k": column})
    order = merge_order(table, ('"k" DESC',))
    assert order is not None
    assert table.take(order)["k"].to_pylist() == sorted(values, reverse=True)
