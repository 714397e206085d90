"""Shared test helpers: building small partitioned tables, the single-process DuckDB oracle, result
comparison, and running queries on real MPI ranks."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import duckdb
import pyarrow as pa

from duckflock.bench.compare import difference
from duckflock.catalog import Catalog, PartitionInfo, TableInfo
from duckflock.catalog.partitioning import canonical_hash_type, hash_sql
from duckflock.catalog.partitioning import quote_ident as q
from duckflock.exec.launch import mpiexec_argv

RUNNER = Path(__file__).parent / "distributed" / "run_queries.py"


def make_table(
    root: Path,
    name: str,
    select_sql: str,
    partitions: int = 1,
    kind: str = "none",
    keys: tuple[str, ...] = (),
) -> TableInfo:
    """Write ``select_sql``'s rows as Parquet partitions of table ``name`` and register it.

    kind "hash": partition p holds rows with hash(keys) % partitions == p (duckflock's function);
    kind "none": rows dealt round-robin; kind "range": split by key order into contiguous ranges.
    """
    con = duckdb.connect()
    con.execute(f"CREATE TABLE src AS {select_sql}")
    cols = tuple((r[0], r[1]) for r in con.execute("DESCRIBE src").fetchall())
    types = dict(cols)
    (root / name).mkdir(parents=True, exist_ok=True)
    if kind == "hash":
        part_expr = hash_sql(
            [q(k) for k in keys], tuple(canonical_hash_type(types[k]) for k in keys), partitions
        )
    elif kind == "range":
        part_expr = f"(ntile({partitions}) OVER (ORDER BY {q(keys[0])}) - 1)"
    else:
        part_expr = f"((row_number() OVER ()) % {partitions})"
    con.execute(f"CREATE TABLE parted AS SELECT *, {part_expr} AS __p FROM src")
    infos = []
    for p in range(partitions):
        rel = f"(SELECT * EXCLUDE (__p) FROM parted WHERE __p = {p})"
        path = root / name / f"{name}.{p}.parquet"
        con.execute(f"COPY {rel} TO '{path}' (FORMAT parquet)")
        rows = con.execute(f"SELECT count(*) FROM {rel}").fetchall()[0][0]
        lo = hi = None
        if kind == "range" and rows:
            lo, hi = con.execute(f"SELECT min({q(keys[0])}), max({q(keys[0])}) FROM {rel}").fetchall()[0]
        infos.append(PartitionInfo((f"{name}/{name}.{p}.parquet",), rows, lo, hi))
    info = TableInfo(name, "parquet", cols, tuple(infos), kind=kind, keys=keys)
    catalog = Catalog.open_or_create(root)
    catalog.put(info)
    catalog.save()
    return info


def oracle(data: Path) -> duckdb.DuckDBPyConnection:
    """Single-process DuckDB over all of a data directory's files: the ground truth."""
    catalog = Catalog.load(data)
    con = duckdb.connect()
    for name, info in catalog.tables.items():
        files = [catalog.path(f) for p in info.partitions for f in p.files]
        listing = ", ".join(f"'{f}'" for f in files)
        con.execute(f"CREATE VIEW {q(name)} AS SELECT * FROM read_parquet([{listing}])")
    return con


def assert_same(got: pa.Table, expected: pa.Table, order_by: list[str] | None = None) -> None:
    """Equal as multisets (floats within 1e-9 relative; everything else exact), same column names and
    types; with ``order_by`` the sequence of those columns must match too."""
    problem = difference(got, expected, order_by)
    assert problem is None, problem


def run_on_ranks(
    data: Path,
    ranks: int,
    queries: list[str],
    out: Path,
    env: dict[str, str] | None = None,
    timeout: float = 240,
) -> list[pa.Table | str]:
    """Run queries in one SPMD job of ``ranks`` MPI processes; each result is a table or an error text."""
    out.mkdir(parents=True, exist_ok=True)
    spec = out / "queries.json"
    spec.write_text(json.dumps(queries))
    argv = mpiexec_argv(ranks, [str(RUNNER), str(data), str(spec), str(out)])
    proc = subprocess.run(
        argv, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results: list[pa.Table | str] = []
    for i in range(len(queries)):
        err = out / f"{i}.err"
        if err.exists():
            results.append(err.read_text())
        else:
            with pa.memory_map(str(out / f"{i}.arrow")) as src:
                results.append(pa.ipc.open_file(src).read_all())
    return results


def build_edge_tables(root: Path) -> None:
    """Tables that force the corner cases: mixed key types, NULLs, empty and one-row tables, skew,
    string and multi-column keys, more partitions than rows. Values come from expressions over
    range(); expected answers come from single-process DuckDB, never from the test."""
    make_table(
        root,
        "t_int",
        "SELECT (i % 300)::INTEGER AS k, i::INTEGER AS v FROM range(2000) t(i)",
        5,
        "hash",
        ("k",),
    )
    make_table(
        root, "t_big", "SELECT i::BIGINT AS k, 'w' || (i % 7) AS w FROM range(0, 400) t(i)", 3, "hash", ("k",)
    )
    make_table(
        root, "t_big4", "SELECT i::BIGINT AS k, i * 1.5 AS d FROM range(0, 400) t(i)", 5, "hash", ("k",)
    )
    make_table(
        root,
        "na",
        "SELECT CASE WHEN i % 4 = 0 THEN NULL ELSE i % 50 END::INTEGER AS k, i AS x FROM range(500) t(i)",
        4,
    )
    make_table(
        root,
        "nb",
        "SELECT CASE WHEN i % 3 = 0 THEN NULL ELSE i % 40 END::BIGINT AS k, i * 10 AS y FROM range(300) t(i)",
        3,
    )
    make_table(root, "empty_t", "SELECT i::BIGINT AS k, 'z' AS z FROM range(0) t(i)", 1)
    make_table(root, "one_row", "SELECT 42::BIGINT AS k, 'only' AS label", 4, "hash", ("k",))
    make_table(root, "skew", "SELECT 1::INTEGER AS k, i AS v FROM range(1500) t(i)", 4)
    make_table(root, "skew2", "SELECT (i % 2)::INTEGER AS k, i AS u FROM range(60) t(i)", 3)
    make_table(root, "sa", "SELECT 'name-' || (i % 97) AS name, i AS v FROM range(800) t(i)", 4)
    make_table(
        root, "sb", "SELECT 'name-' || i AS name, i * 3 AS w FROM range(120) t(i)", 2, "range", ("name",)
    )
    make_table(
        root, "m1", "SELECT (i % 20)::INTEGER AS a, 'b' || (i % 3) AS b, i AS v FROM range(600) t(i)", 4
    )
    make_table(
        root,
        "m2",
        "SELECT (i % 25)::BIGINT AS a, 'b' || (i % 4) AS b, i AS w FROM range(200) t(i)",
        3,
        "hash",
        ("a", "b"),
    )
    make_table(
        root,
        "prices",
        "SELECT i::BIGINT AS k, (i * 1.25)::DECIMAL(12,2) AS price, "
        "DATE '2020-01-01' + (i % 365)::INTEGER AS day FROM range(1000) t(i)",
        6,
        "range",
        ("k",),
    )
