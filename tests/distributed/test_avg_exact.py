"""A split AVG equals single-process DuckDB's to the last bit, not just within a tolerance: DuckDB
finishes AVG in a long double unless its optimizer rewrites it as SUM / COUNT (duckdb_avg.py,
plan/aggregates._avg_rewritten); both ways are reproduced. TPC-H Q1's shape is among the cases."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import duckflock
from duckflock import duckdb_avg
from support import make_table, oracle

pytestmark = [
    pytest.mark.dist,
    pytest.mark.skipif(not duckdb_avg.EXACT, reason="numpy's longdouble is not x87's here"),
]

COLUMNS = {
    "d2": "DECIMAL(15,2)",  # TPC-H's prices and discounts: an 8-byte decimal
    "d1": "DECIMAL(4,1)",  # a 2-byte decimal: DuckDB divides in DOUBLE
    "d9": "DECIMAL(18,9)",
    "d38": "DECIMAL(38,6)",
    "i": "INTEGER",
    "b": "BIGINT",
}
QUERIES = [
    "SELECT g, avg(d2) AS a, avg(d1) AS a1, avg(d9) AS a9, avg(d38) AS a38, avg(i) AS ai, avg(b) AS ab, "
    "count(*) AS n FROM t GROUP BY g",
    # Q1's shape: some AVGs beside the SUM of their argument (DuckDB rewrites those), some alone.
    "SELECT g, sum(d2) AS s, avg(d2) AS a, avg(d9) AS a9, count(d9) AS c9, avg(b) AS ab FROM t GROUP BY g",
    "SELECT g, avg(d2) FILTER (WHERE i % 3 = 0) AS a, sum(d2) AS s FROM t GROUP BY g",
    "SELECT avg(d2) AS a, avg(d9) AS a9, avg(b) AS ab, avg(d1) FILTER (WHERE i > 0) AS af FROM t",
    "SELECT g, h, avg(d2) AS a, avg(b) AS ab FROM t GROUP BY ROLLUP (g, h)",
    "SELECT g, avg(d9) AS a FROM t WHERE g < 0 GROUP BY g",  # no group at all
]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("avg")
    cols = ", ".join(
        f"TRY_CAST((random() - 0.4) * 2 ^ (random() * {bits}) / 10 ^ {scale} AS {COLUMNS[c]}) AS {c}"
        for c, bits, scale in (
            ("d2", 40, 2),
            ("d1", 13, 1),
            ("d9", 60, 9),
            ("d38", 100, 6),
            ("i", 30, 0),
            ("b", 62, 0),
        )
    )
    con = duckdb.connect()
    con.execute("SELECT setseed(0.5)").fetchall()  # the same rows on every run: a failure can be replayed
    rows = con.sql(f"SELECT (i % 97)::INTEGER AS g, (i % 3)::INTEGER AS h, {cols} FROM range(30000) r(i)")
    make_table(root, "t", rows.to_arrow_table(), partitions=3)
    return root


@pytest.mark.parametrize("ranks", [2, 3])
def test_avg_is_duckdbs_to_the_last_bit(data: Path, ranks: int) -> None:
    truth = oracle(data)
    with duckflock.connect(str(data), ranks=ranks, transport="threads") as db:
        for sql in QUERIES:
            order = " ORDER BY ALL NULLS FIRST"
            got = db.sql(sql + order).fetchall()
            expected = truth.sql(sql + order).fetchall()
            assert got == expected, sql
    truth.close()
