"""duckdb_avg reproduces DuckDB's AVG from a sum and a count bit for bit: every group of random
values of every exact numeric type, small and huge sums, negative ones, NULLs and empty groups."""

import duckdb
import pytest

from duckflock import duckdb_avg

TYPES = {
    "TINYINT": 7,
    "SMALLINT": 15,
    "UTINYINT": 8,
    "INTEGER": 31,
    "USMALLINT": 16,
    "UINTEGER": 32,
    "BIGINT": 63,
    "UBIGINT": 64,
    "HUGEINT": 100,
    "DECIMAL(4,1)": 14,
    "DECIMAL(4,4)": 14,
    "DECIMAL(9,2)": 30,
    "DECIMAL(15,2)": 40,
    "DECIMAL(18,9)": 60,
    "DECIMAL(18,12)": 60,
    "DECIMAL(30,0)": 90,
    "DECIMAL(38,3)": 100,
    "DECIMAL(38,25)": 110,
}

pytestmark = pytest.mark.skipif(not duckdb_avg.EXACT, reason="numpy's longdouble is not x87's here")


@pytest.mark.parametrize("arg_type", list(TYPES))
def test_finalize_equals_duckdb_avg(arg_type: str) -> None:
    bits = TYPES[arg_type]
    scale = int(arg_type.split(",")[1].rstrip(")")) if "," in arg_type else 0
    con = duckdb.connect()
    try:
        duckdb_avg.register(con)
        con.execute("SELECT setseed(0.25)")
        # Values spread over many magnitudes, half of the groups all negative, some NULLs, a group
        # with only NULLs (400): both paths give NULL there.
        con.execute(
            f"""CREATE TABLE t AS SELECT g, CASE WHEN g = 400 OR i % 17 = 0 THEN NULL
                ELSE TRY_CAST(v / 10.0 ^ {scale} * (CASE WHEN g % 2 = 0 THEN -1 ELSE 1 END) AS {arg_type}) END AS x
            FROM (SELECT i, (random() * 400)::INT AS g, random() * 2 ^ (random() * {bits}) AS v
                  FROM range(40000) r(i))"""
        )
        total = (
            f"CAST(s AS {'DECIMAL(38,' + str(scale) + ')' if arg_type.startswith('DECIMAL') else 'HUGEINT'})"
        )
        mine = duckdb_avg.finalize_sql(total, "n", arg_type)
        assert mine is not None
        # avg alone in its GROUP BY: DuckDB's optimizer leaves it unrewritten.
        rows = con.execute(
            f"""SELECT count(*), count(*) FILTER (WHERE a IS DISTINCT FROM {mine}), count(*) FILTER (WHERE a IS NULL)
            FROM (SELECT g, avg(x) AS a FROM t GROUP BY g)
            JOIN (SELECT g, sum(x) AS s, CAST(count(x) AS HUGEINT) AS n FROM t GROUP BY g) USING (g)"""
        ).fetchall()
        groups, differ, nulls = rows[0]
        assert groups > 350 and nulls >= 1
        assert differ == 0
    finally:
        con.close()


def test_not_reproduced_types() -> None:
    assert duckdb_avg.finalize_sql("s", "n", "DOUBLE") is None
    assert duckdb_avg.finalize_sql("s", "n", "UHUGEINT") is None


def test_null_inputs_and_no_rows_give_null() -> None:
    con = duckdb.connect()
    try:
        duckdb_avg.register(con)
        rows = con.execute(
            "SELECT duckflock_avg_s2(CAST(s AS DECIMAL(38,2)), CAST(n AS HUGEINT), FALSE), "
            "duckflock_avg_int(CAST(s AS HUGEINT), CAST(n AS HUGEINT), TRUE) "
            "FROM (VALUES (1.25, 3), (NULL, 2), (2.5, 0), (1, NULL), (-7.5, 2)) t(s, n)"
        ).fetchall()
        assert rows == [(1.25 / 3, 1 / 3), (None, None), (None, None), (None, None), (-3.75, -4.0)]
    finally:
        con.close()
