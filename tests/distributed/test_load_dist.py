"""`duckflock load` as a user runs it: several MPI ranks repartition files in parallel; the table then
answers queries exactly like DuckDB over the original files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import duckdb
import pytest

from duckflock.catalog import Catalog
from duckflock.catalog.placement import hash_sql
from duckflock.config import Config
from duckflock.plan.nodes import Join, walk
from duckflock.plan.planner import plan_query
from duckflock.sql.schema_db import SchemaDB
from support import assert_same, run_on_ranks

pytestmark = pytest.mark.dist


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "duckflock.cli.main", *args], capture_output=True, text=True, timeout=timeout
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


def test_a_bad_csv_line_names_its_rank_once_and_leaves_nothing_behind(sources, tmp_path):
    bad = tmp_path / "bad.csv"  # the bad line far below the lines DuckDB's sniffer samples
    bad.write_text("k,v\n" + "".join(f"{i},{i}\n" for i in range(30000)) + "x,y\n")
    for data, before in ((tmp_path / "new", None), (tmp_path / "old", ["dim"])):
        if before:
            assert (
                cli("load", "--data", str(data), "--table", "dim", str(sources / "dim.csv")).returncode == 0
            )
        # Bounded well below the 30 s a rank waits for its receivers: the other rank is told at once.
        proc = cli(
            "load",
            "--data",
            str(data),
            "--table",
            "t",
            str(bad),
            "--partition-by",
            "k",
            "--ranks",
            "2",
            timeout=60,  # usually ~1 s; one CI run under load took over 20 s (cause not found)
        )
        assert proc.returncode == 1
        assert (
            proc.stderr.startswith(f"error: rank 0: loading {bad} failed: ")
            and proc.stderr.count("rank ") == 1
        )
        if before is None:
            assert not data.exists(), list(data.rglob("*"))
        else:
            assert not (data / "t").exists() and sorted(Catalog.load(data).tables) == before


def _place_by_another_hash(data, table: str, parts: int) -> None:
    """Rewrite a hash table as a DuckDB with another hash() would have placed it: rows by k % parts,
    under other file names, with that DuckDB's canary and version in the catalog."""
    path = data / "duckflock_catalog.json"
    catalog = json.loads(path.read_text())
    entry = catalog["tables"][table]
    files = [str(data / f) for p in entry["partitions"] for f in p["files"]]
    con = duckdb.connect()
    con.execute(f"CREATE TABLE rows AS SELECT * FROM read_parquet({files})")
    for f in files:
        os.unlink(f)
    entry["partitions"] = []
    for p in range(parts):
        name = f"{table}/old.{p}.parquet"
        con.execute(f"COPY (SELECT * FROM rows WHERE k % {parts} = {p}) TO '{data / name}' (FORMAT parquet)")
        n = con.execute(f"SELECT count(*) FROM rows WHERE k % {parts} = {p}").fetchall()[0][0]
        entry["partitions"].append({"files": [name], "rows": n, "min": None, "max": None})
    entry["partitioning"]["hash_canary"] += 1
    entry["partitioning"]["duckdb"] = "0.0.1-other"
    path.write_text(json.dumps(catalog))


def _join_strategy(data, sql: str) -> str:
    catalog = Catalog.load(data)
    p = plan_query(sql, catalog, SchemaDB(catalog), 2, Config(broadcast_threshold_bytes=0))
    return next(n for s in p.stages for n in walk(s.root) if isinstance(n, Join)).strategy


def test_repartition_rewrites_a_table_placed_by_another_hash(sources, tmp_path):
    data = tmp_path / "data"
    load = ["load", "--data", str(data), "--ranks", "3", "--table"]
    facts = [f"{sources}/part*.parquet", "--partition-by", "k", "--partitions", "6"]
    assert cli(*load, "facts", *facts).returncode == 0
    assert cli(*load, "dim", f"{sources}/dim.csv").returncode == 0
    _place_by_another_hash(data, "facts", 6)
    self_join = "SELECT a.k, count(*) AS n FROM facts a JOIN facts b ON a.k = b.k GROUP BY a.k"
    with pytest.warns(UserWarning, match="0.0.1-other.*duckflock load --data DIR --repartition"):
        assert _join_strategy(data, self_join) != "co-located"

    proc = cli("load", "--data", str(data), "--repartition", "--ranks", "3")
    assert proc.returncode == 0, proc.stderr
    assert "repartitioned facts: 2500 rows in 6 partitions (hash on k)" in proc.stdout
    assert "dim" not in proc.stdout  # not hash-partitioned: left as it is

    info = Catalog.load(data).table("facts")
    assert info.hash_is_current() and info.duckdb_version == duckdb.__version__
    assert not list((data / "facts").glob("old.*")) and not list((data / "facts").glob(".load-*"))
    con = duckdb.connect()
    for p, part in enumerate(info.partitions):  # every row where this DuckDB's hash puts it
        files = [str(data / f) for f in part.files]
        placed = hash_sql(["k"], info.hash_key_types(), 6)
        assert con.execute(
            f"SELECT count(*) FROM read_parquet({files}) WHERE {placed} <> {p}"
        ).fetchall() == [(0,)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the warning is gone, and the join is co-located again
        assert _join_strategy(data, self_join) == "co-located"

    queries = [
        self_join,
        "SELECT f.s, count(*) AS n, sum(d.w) AS sw FROM facts f JOIN dim d ON f.k = d.k GROUP BY f.s",
    ]
    ref = duckdb.connect()
    ref.execute(f"CREATE VIEW facts AS SELECT * FROM read_parquet('{sources}/part*.parquet')")
    ref.execute(f"CREATE VIEW dim AS SELECT * FROM read_csv('{sources}/dim.csv')")
    for q, got in zip(queries, run_on_ranks(data, 3, queries, tmp_path / "out"), strict=True):
        assert not isinstance(got, str), got
        assert_same(got, ref.sql(q).to_arrow_table())

    proc = cli("load", "--data", str(data), "--repartition", "--ranks", "2")
    assert proc.returncode == 0 and "already matches" in proc.stdout, proc.stderr


def test_repartition_takes_no_inputs_and_load_needs_them(tmp_path):
    proc = cli("load", "--data", str(tmp_path), "--repartition", "x.parquet")
    assert proc.returncode == 1 and "give no input files" in proc.stderr, proc.stderr
    proc = cli("load", "--data", str(tmp_path), "x.parquet")
    assert proc.returncode == 1 and "load needs --table" in proc.stderr, proc.stderr


@pytest.mark.parametrize("option", [["--scheme", "range"], ["--scheme", "hash"], ["--partitions", "4"]])
def test_partitioning_options_without_partition_by_are_refused(tmp_path, option):
    proc = cli("load", "--data", str(tmp_path), "--table", "t", "x.parquet", *option)
    assert proc.returncode == 1 and "need --partition-by" in proc.stderr, proc.stderr
