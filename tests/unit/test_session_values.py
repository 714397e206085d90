"""A result's Python values and pandas columns are those single-process DuckDB gives, though the
rows travel as Arrow (which turns a HUGEINT into a Decimal, an INTERVAL into a MonthDayNano, a MAP
into pairs and a UUID into text)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import duckdb
import pytest

import duckflock
from duckflock.errors import DuckflockError
from duckflock.local_duckdb import arrow_exact
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
            # Files are written by DuckDB from the ranks' lossless Arrow form: as its COPY writes them.
            sql = f"SELECT {expr} AS v FROM t"
            db.sql(sql, output=str(tmp_path / "out.csv"))
            oracle(tmp_path).execute(f"COPY ({sql}) TO '{tmp_path / 'want.csv'}'")
            assert (tmp_path / "out.csv").read_bytes() == (tmp_path / "want.csv").read_bytes()
        assert db.sql("SELECT count(*) FROM t").fetchall() == [(3,)]


def test_values_another_rank_would_read_back_as_others_are_refused_where_they_would_cross(tmp_path):
    # Each answered wrongly before: an ENUM the planner cannot see (its type text computed) read back
    # as VARCHAR sorts 'a' before 'b'; an INTERVAL over 2,562,047 hours in a LIST wrapped around,
    # so a partial max picked another row.
    rows = "SELECT i, CASE WHEN i % 2 = 0 THEN 'b' ELSE 'a' END AS s, CASE WHEN i % 3 = 0 THEN 3000000 ELSE i END AS h"
    make_table(tmp_path, "t", f"{rows} FROM range(20) r(i)", 3)
    enum = """from_json('"' || s || '"', '"EN' || 'UM(''b'', ''a'')"')"""
    refused = {
        f"SELECT e, i FROM (SELECT {enum} AS e, i FROM t) ORDER BY e, i": "ENUM values",
        "SELECT i % 2 AS g, max([to_hours(h)])::VARCHAR AS v FROM t GROUP BY g": "over 2562047 hours",
        # Arrow's unions have no validity of their own: one whose member is NULL reads back as NULL.
        "SELECT i % 2 AS g, count(u) AS c FROM (SELECT DISTINCT i % 2 AS i, union_value(x := CASE "
        "WHEN i < 4 THEN NULL ELSE i END) AS u FROM t) GROUP BY g": "UNION whose member is NULL",
    }
    with duckflock.connect(
        str(tmp_path), ranks=2, transport="threads", config={"broadcast_threshold_bytes": 0}
    ) as db:
        for sql, why in refused.items():
            with pytest.raises(DuckflockError, match=why):
                db.sql(sql)
        assert db.sql(f"SELECT count(*) FROM t WHERE {enum} = 'b'").fetchall() == [(10,)]
        # Unnamed STRUCTs the planner sees are answered on the driver: read back on another rank
        # they would be named (element1, ...) and print so.
        sql = "SELECT i % 3 AS g, max((i, s))::VARCHAR AS v, max(list_zip([i], [s]))::VARCHAR AS w FROM t GROUP BY g"
        assert sorted(db.sql(sql).fetchall()) == sorted(oracle(tmp_path).sql(sql).fetchall())
    # One it does not see is refused where a stage would send it.
    con = duckdb.connect()
    for sql in ("SELECT (1, 'a') AS v", "SELECT [{'x': (1, 2)}] AS v"):
        with pytest.raises(DuckflockError, match="unnamed STRUCT values"):
            arrow_exact(con, sql, exchanged=True)
        assert arrow_exact(con, sql) == sql  # a result for the caller is DuckDB's own Arrow form


def test_show_prints_values_as_duckdb_writes_them(tmp_path):
    """Each value as DuckDB's CAST to VARCHAR gives it, as its own tables show it: infinite dates
    (which Python's cannot hold), FLOAT's shortest digits, a MAP, an INTERVAL, a BIGNUM, a VARIANT;
    a struct field named like a type Arrow loses is no reason to refuse."""
    import io

    from rich.console import Console

    make_table(tmp_path, "t", "SELECT i FROM range(3) r(i)", 2, "hash", ("i",))
    exprs = [
        "'infinity'::DATE", "'-infinity'::TIMESTAMP", "(1 / 7)::FLOAT", "MAP {'k1': i}", "to_months(i + 1)",
        "(i * 1000)::BIGNUM", "i::VARIANT", "{'bit': i}", "'x1'::BLOB",
    ]  # fmt: skip
    sql = f"SELECT {', '.join(f'{e} AS c{n}' for n, e in enumerate(exprs))} FROM t WHERE i = 2"
    want = oracle(tmp_path).sql(f"SELECT COLUMNS(*)::VARCHAR FROM ({sql})").fetchall()[0]
    out = io.StringIO()
    with duckflock.connect(str(tmp_path), ranks=2, transport="threads") as db:
        db.sql(sql).show(console=Console(file=out, width=300))
    cells = [c.strip() for c in out.getvalue().splitlines()[3].strip("│").split("│")]
    assert cells == list(want)


def test_polars_and_time_zones_as_duckdb_gives_them(tmp_path):
    """``.pl()`` renames repeated columns as DuckDB's does; TIMESTAMPTZ values come in the session's
    time zone, not the host's."""
    make_table(tmp_path, "t", "SELECT i FROM range(3) r(i)", 2, "hash", ("i",))
    sql = (
        "SELECT i, i, 1 AS one, 2 AS \"ONE\", TIMESTAMPTZ '2020-01-01 00:00:01+00' + to_hours(i) AS ts FROM t"
    )
    want = oracle(tmp_path)
    want.execute("SET TimeZone = 'Asia/Tokyo'")
    with duckflock.connect(
        str(tmp_path), ranks=2, transport="threads", config={"time_zone": "Asia/Tokyo"}
    ) as db:
        got = db.sql(sql + " ORDER BY 1")
        assert got.pl().columns == want.sql(sql + " ORDER BY 1").pl().columns
        df, want_df = got.df(), want.sql(sql + " ORDER BY 1").df()
        assert list(df.dtypes) == list(want_df.dtypes) and df.astype(str).equals(want_df.astype(str))
        # A CSV file writes TIMESTAMPTZ (also nested) as text in the session's zone.
        csv = (
            "SELECT i, ts, [ts] AS l, ts::VARIANT AS v FROM (" + sql.replace("i, i, ", "i, ") + ") ORDER BY i"
        )
        db.sql(csv, output=str(tmp_path / "got.csv"))
        want.execute(f"COPY ({csv}) TO '{tmp_path / 'want.csv'}'")
        assert (tmp_path / "got.csv").read_text() == (tmp_path / "want.csv").read_text()
    with pytest.raises(DuckflockError, match="time_zone 'Nowhere/Zone'"):
        duckflock.connect(str(tmp_path), ranks=2, transport="threads", config={"time_zone": "Nowhere/Zone"})


def test_queries_from_several_threads_take_turns(tmp_path):
    make_table(tmp_path, "t", "SELECT i, i % 5 AS g FROM range(1000) r(i)", 3, "hash", ("i",))
    queries = ["SELECT g, sum(i) AS s FROM t GROUP BY g ORDER BY g", "SELECT count(DISTINCT g) FROM t"]
    want = [oracle(tmp_path).sql(q).fetchall() for q in queries]
    with duckflock.connect(str(tmp_path), ranks=2, transport="threads") as db, ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda k: db.sql(queries[k % 2]).fetchall(), range(8)))
    assert got == [want[k % 2] for k in range(8)]


def test_plans_holding_the_clock_or_reading_files_are_not_reused(tmp_path):
    """A plan is reused for the same text: not one that holds the instant it was made at (each
    query reads the clock anew, as DuckDB's does), nor one over a file whose columns changed."""
    import duckdb

    make_table(tmp_path, "t", "SELECT i FROM range(3) r(i)", 2, "hash", ("i",))
    file = tmp_path / "f.parquet"
    duckdb.sql(f"COPY (SELECT 1 AS a, 2 AS b) TO '{file}'")
    with duckflock.connect(str(tmp_path), ranks=2, transport="threads") as db:
        clock = "SELECT max(epoch_us(now())) AS n FROM t"
        first = db.sql(clock).fetchall()
        # the clock's microseconds: a later transaction reads a later one
        while duckdb.sql("SELECT epoch_us(now())").fetchall()[0][0] <= first[0][0]:
            pass
        assert db.sql(clock).fetchall() > first
        read = f"SELECT * FROM read_parquet('{file}')"
        assert db.sql(read).arrow().to_pylist() == [{"a": 1, "b": 2}]
        duckdb.sql(f"COPY (SELECT 2 AS b, 1 AS a) TO '{file}'")
        assert db.sql(read).arrow().to_pylist() == [{"b": 2, "a": 1}]
        # a file named in FROM with an alias, joined with a table: DuckDB reads it on the driver
        aliased = f"SELECT x.a, t.i FROM '{file}' AS x JOIN t ON x.a = t.i"
        assert db.sql(aliased).fetchall() == [(1, 1)]


def test_statement_punctuation_parameters_and_a_closed_session(tmp_path):
    """A comment after the statement or an empty statement before it is DuckDB's one statement;
    query parameters and a closed session get a message saying so, not a misleading one."""
    make_table(tmp_path, "t", "SELECT i FROM range(3) r(i)", 2, "hash", ("i",))
    db = duckflock.connect(str(tmp_path), ranks=2, transport="threads")
    for sql in ("SELECT count(*) FROM t; -- c", "SELECT count(*) FROM t; /* c */", ";SELECT count(*) FROM t"):
        assert db.sql(sql).fetchall() == [(3,)]
    with pytest.raises(DuckflockError, match="parameters are not supported"):
        db.sql("SELECT count(*) FROM t WHERE i = ?", [1])
    db.close()
    db.close()
    with pytest.raises(DuckflockError, match="the session is closed"):
        db.sql("SELECT 1")
