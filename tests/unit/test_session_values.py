"""A result's Python values and pandas columns are those single-process DuckDB gives, though the
rows travel as Arrow (which turns a HUGEINT into a Decimal, an INTERVAL into a MonthDayNano, a MAP
into pairs and a UUID into text)."""

from __future__ import annotations

import duckflock
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
