"""`duckflock load` as a user runs it: several MPI ranks repartition files in parallel; the table then
answers queries exactly like DuckDB over the original files."""

from __future__ import annotations

import subprocess
import sys

import duckdb
import pytest

from duckflock.catalog import Catalog
from support import assert_same, run_on_ranks

pytestmark = pytest.mark.dist


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "duckflock.cli.main", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    con = duckdb.connect()
    for i in range(5):  # five input files of different sizes, keys overlapping across files
        con.execute(
            f"COPY (SELECT (r * 7 + {i}) % 1000 AS k, r AS v, 'f{i}-' || (r % 13) AS s "
            f"FROM range({300 + 100 * i}) t(r)) TO '{src}/part{i}.parquet' (FORMAT parquet)"
        )
    con.execute(f"COPY (SELECT r % 50 AS k, r * 2 AS w FROM range(400) t(r)) TO '{src}/dim.csv' (HEADER)")
    return src


@pytest.mark.parametrize(("scheme", "ranks"), [("hash", 2), ("hash", 3), ("range", 3)])
def test_load_repartitions_in_parallel_and_queries_match(sources, tmp_path, scheme, ranks):
    data = tmp_path / "data"
    proc = cli(
        "load",
        "--data",
        str(data),
        "--table",
        "facts",
        f"{sources}/part*.parquet",
        "--partition-by",
        "k",
        "--partitions",
        "6",
        "--scheme",
        scheme,
        "--ranks",
        str(ranks),
    )
    assert proc.returncode == 0, proc.stderr
    proc = cli("load", "--data", str(data), "--table", "dim", f"{sources}/dim.csv", "--ranks", str(ranks))
    assert proc.returncode == 0, proc.stderr
    info = Catalog.load(data).table("facts")
    assert info.kind == scheme and info.keys == ("k",) and len(info.partitions) == 6
    queries = [
        "SELECT k, count(*) AS n, sum(v) AS sv FROM facts GROUP BY k",
        "SELECT f.s, count(*) AS n, sum(d.w) AS sw FROM facts f JOIN dim d ON f.k = d.k GROUP BY f.s",
        "SELECT count(*) AS n, count(DISTINCT s) AS ds FROM facts",
    ]
    results = run_on_ranks(data, ranks, queries, tmp_path / "out")
    ref = duckdb.connect()
    ref.execute(f"CREATE VIEW facts AS SELECT * FROM read_parquet('{sources}/part*.parquet')")
    ref.execute(f"CREATE VIEW dim AS SELECT * FROM read_csv('{sources}/dim.csv')")
    for q, got in zip(queries, results, strict=True):
        assert not isinstance(got, str), got
        assert_same(got, ref.sql(q).to_arrow_table())


def test_load_of_a_missing_file_fails_with_one_message(tmp_path):
    proc = cli(
        "load",
        "--data",
        str(tmp_path / "d"),
        "--table",
        "t",
        str(tmp_path / "nope.parquet"),
        "--partition-by",
        "k",
        "--ranks",
        "3",
    )
    assert proc.returncode == 1
    assert "nope.parquet" in proc.stderr and proc.stderr.count("error:") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
