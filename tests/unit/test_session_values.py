"""A result's Python values and pandas columns are those single-process DuckDB gives, though the
rows travel as Arrow (which turns a HUGEINT into a Decimal, an INTERVAL into a MonthDayNano, a MAP
into pairs and a UUID into text)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

import duckflock
from duckflock.errors import DuckflockError
from support import make_table, oracle

SQL = (
    "SELECT i, i::HUGEINT * 3 AS h, ('00000000-0000-0000-0000-00000000000' || i)::UUID AS u, "
    "to_days(i::INTEGER) AS iv, map([i], ['v' || i]) AS m, {'a': i} AS s, (i / 4)::DECIMAL(9,2) AS d, "
    "CAST(NULL AS HUGEINT) AS n, i AS i FROM t ORDER BY i"
)


def test_fetchall_and_df_give_duckdbs_python_values(tmp_path):
    make_table(tmp_path, "t", "SELECT i FROM range(6) r(i)", 3, "hash", ("i",))
    want = oracle(tmp_path).sql(SQL)
    with duckflock.connect(str(tmp_path), ranks=2, transport="threads") as db:
        got = db.sql(SQL)
        rows, expected = got.fetchall(), want.fetchall()
        assert rows == expected
        assert [[type(v) for v in r] for r in rows] == [[type(v) for v in r] for r in expected]
        df, want_df = got.df(), oracle(tmp_path).sql(SQL).df()
        assert list(df.columns) == list(want_df.columns) and list(df.dtypes) == list(want_df.dtypes)
        assert df.astype(str).equals(want_df.astype(str))
        empty = "SELECT i::HUGEINT AS h FROM t WHERE i < 0"
        assert db.sql(empty).fetchall() == [] and len(db.sql(empty).df()) == 0


def test_types_lost_in_arrow_are_refused_not_converted(tmp_path):
    # DuckDB's Arrow form of these has lost values: converting it would answer wrongly.
    make_table(tmp_path, "t", "SELECT i FROM range(3) r(i)", 2, "hash", ("i",))
    cases = {
        "'12:00:00+05'::TIMETZ": "TIME WITH TIME ZONE",
        "'1010'::BIT": "BIT",
        "340282366920938463463374607431768211455::UHUGEINT": "UHUGEINT",
    }
    with duckflock.connect(str(tmp_path), ranks=2, transport="threads") as db:
        for expr, typ in cases.items():
            got = db.sql(f"SELECT i, {expr} AS v FROM t")
            assert got.arrow().num_rows == 3
            for convert in (got.fetchall, got.df, got.show):
                with pytest.raises(DuckflockError, match=f"'v' of type {typ}"):
                    convert()
            with pytest.raises(DuckflockError, match="CAST it to VARCHAR"):
                db.sql(f"SELECT {expr} AS v FROM t", output=str(tmp_path / "out.csv"))
        assert db.sql("SELECT count(*) FROM t").fetchall() == [(3,)]


def test_queries_from_several_threads_take_turns(tmp_path):
    make_table(tmp_path, "t", "SELECT i, i % 5 AS g FROM range(1000) r(i)", 3, "hash", ("i",))
    queries = ["SELECT g, sum(i) AS s FROM t GROUP BY g ORDER BY g", "SELECT count(DISTINCT g) FROM t"]
    want = [oracle(tmp_path).sql(q).fetchall() for q in queries]
    with duckflock.connect(str(tmp_path), ranks=2, transport="threads") as db, ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda k: db.sql(queries[k % 2]).fetchall(), range(8)))
    assert got == [want[k % 2] for k in range(8)]
