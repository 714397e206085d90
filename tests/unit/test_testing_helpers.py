"""The helpers tests, the demo and the benchmarks share: the oracle over a data directory, result
comparison, the TPC-H queries as package data, the one number formatter, and the `duckflock bench`
entry when the benchmarks project is not installed."""

from __future__ import annotations

import datetime as dt
import importlib.util
import math

import duckdb
import pyarrow as pa

from duckflock.catalog import Catalog, PartitionInfo, TableInfo
from duckflock.cli import main as cli_main
from duckflock.sqltext import sql_literal
from duckflock.testing.compare import same_result
from duckflock.testing.tables import make_table, oracle
from duckflock.testing.tpch import ORDER, SEED_QUERY, queries
from duckflock.units import human


def test_tpch_queries_are_package_data():
    qs = queries()
    assert sorted(qs) == list(range(1, 23))
    assert all("select" in q.lower() for q in qs.values())
    assert set(ORDER) <= set(qs)
    assert "JOIN orders" in SEED_QUERY


def test_oracle_reads_every_table_with_quoted_paths(tmp_path):
    root = tmp_path / "it's here"  # a quote in the path must not break the views
    make_table(root, "t", "SELECT range AS k FROM range(10)", partitions=3)
    (root / "c").mkdir()
    (root / "c" / "c.csv").write_text("a;b\n1;x\n2;y\n")
    catalog = Catalog.load(root)
    catalog.put(
        TableInfo(
            "c",
            "csv",
            (("a", "BIGINT"), ("b", "VARCHAR")),
            (PartitionInfo(("c/c.csv",), 2),),
            csv_options={"delim": ";", "header": True},
        )
    )
    catalog.put(TableInfo("empty", "parquet", (("x", "INTEGER"),), ()))
    catalog.save()
    con = oracle(root, threads=1)
    assert con.sql("SELECT count(*), sum(k) FROM t").fetchall() == [(10, 45)]
    assert con.sql("SELECT * FROM c ORDER BY a").fetchall() == [(1, "x"), (2, "y")]
    assert con.sql("SELECT x FROM empty").fetchall() == []


def test_same_result_exact_and_within_float_tolerance():
    want = pa.table({"k": [1, 2, 3], "v": [0.1, 0.2, 0.3]})
    assert same_result(want.take([2, 0, 1]), want)
    assert not same_result(want.take([2, 0, 1]), want, order_by=["k"])
    assert same_result(pa.table({"k": [1, 2, 3], "v": [0.1, 0.2, 0.1 + 0.2]}), want)  # 0.30000000000000004
    assert not same_result(pa.table({"k": [1, 2, 3], "v": [0.1, 0.2, 0.4]}), want)


def test_same_result_pairs_nan_with_nan_beside_zeros():
    nan = float("nan")
    # 1 + 2^-52 fails Arrow's exact comparison: the tolerant one pairs the rows
    a = pa.table({"x": [nan, 0.0, 1.0000000000000002, -0.0]})
    b = pa.table({"x": [0.0, -0.0, nan, 1.0]})
    assert same_result(a, b)
    assert not same_result(pa.table({"x": [nan, 0.0]}), pa.table({"x": [0.0, 0.0]}))


def test_human_and_sql_literal():
    assert (human(512, "B"), human(48_000, "B"), human(1234)) == ("512B", "48.0KB", "1.2K")
    assert sql_literal(["/a", "it's"]) == "['/a', 'it''s']"


def test_sql_literal_keeps_instants_and_non_finite_floats():
    # An aware datetime is an instant: as a TIMESTAMP literal its offset was dropped, and compared
    # with a TIMESTAMPTZ it was read in the session's zone (in a DST fold, the other instant).
    con = duckdb.connect()
    con.execute("SET TimeZone = 'America/New_York'")
    fold = dt.datetime(2024, 11, 3, 1, 30, tzinfo=dt.timezone(dt.timedelta(hours=-4)))
    same = f"SELECT {sql_literal(fold)} = TIMESTAMPTZ '2024-11-03 05:30:00+00'"
    assert con.execute(same).fetchall() == [(True,)]
    values = f"SELECT {', '.join(sql_literal(v) for v in (math.inf, -math.inf, 1.5))}, isnan({sql_literal(math.nan)})"
    assert con.execute(values).fetchall() == [(math.inf, -math.inf, 1.5, True)]


def test_bench_without_the_benchmarks_project_says_how_to_install(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "duckflock_bench" else real(name, *a)
    )
    assert cli_main.main(["bench", "seed", "--sf", "0.01"]) == 1
    err = capsys.readouterr().err
    assert "pip install -e benchmarks" in err and err.count("\n") == 1


def test_core_package_holds_no_benchmark_code():
    assert importlib.util.find_spec("duckflock.bench") is None
