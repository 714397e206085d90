"""Small partitioned tables for tests, and the single-process DuckDB that is their ground truth."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pyarrow as pa

from duckflock.catalog import Catalog, PartitionInfo, TableInfo
from duckflock.catalog.partitioning import canonical_hash_type
from duckflock.catalog.placement import hash_sql, range_partition_sql
from duckflock.ingest.widths import with_widths
from duckflock.plan.sql_text import read_table_files
from duckflock.sqltext import quote_ident as q
from duckflock.sqltext import sql_literal


def make_table(
    root: Path,
    name: str,
    source: str | pa.Table,
    partitions: int = 1,
    kind: str = "none",
    keys: tuple[str, ...] = (),
) -> TableInfo:
    """Write the rows of ``source`` (a SELECT, or an Arrow table) as Parquet partitions of table
    ``name`` and register it in the data directory's catalog.

    kind "hash": partition p holds rows with hash(keys) % partitions == p (duckflock's function);
    kind "none": rows dealt round-robin; kind "range": split by key order into contiguous ranges
    of distinct keys, as ``duckflock load --scheme range`` splits.
    """
    con = duckdb.connect()
    if isinstance(source, pa.Table):
        con.register("__arrow_src", source)
        source = "SELECT * FROM __arrow_src"
    # Rows as Parquet gives them back (TIMESTAMP_S reads as TIMESTAMP, UNION as STRUCT, ...): the
    # catalog must record, and hash partitioning use, the types the ranks will read.
    (root / name).mkdir(parents=True, exist_ok=True)
    whole = root / name / "__whole.parquet"
    con.execute(f"COPY ({source}) TO {sql_literal(str(whole))} (FORMAT parquet)")
    con.execute(f"CREATE TABLE src AS SELECT * FROM read_parquet({sql_literal(str(whole))})")
    whole.unlink()
    cols = tuple((r[0], r[1]) for r in con.execute("DESCRIBE src").fetchall())
    types = dict(cols)
    (root / name).mkdir(parents=True, exist_ok=True)
    if kind == "hash":
        part_expr = hash_sql(
            [q(k) for k in keys], tuple(canonical_hash_type(types[k]) for k in keys), partitions
        )
    elif kind == "range":
        part_expr = range_partition_sql(keys[0], types[keys[0]], _splitters(con, keys[0], partitions))
    else:
        part_expr = f"((row_number() OVER ()) % {partitions})"
    con.execute(f"CREATE TABLE parted AS SELECT *, {part_expr} AS __p FROM src")
    infos = []
    for p in range(partitions):
        rel = f"(SELECT * EXCLUDE (__p) FROM parted WHERE __p = {p})"
        path = root / name / f"{name}.{p}.parquet"
        con.execute(f"COPY {rel} TO {sql_literal(str(path))} (FORMAT parquet)")
        rows = con.execute(f"SELECT count(*) FROM {rel}").fetchall()[0][0]
        lo = hi = None
        if kind == "range" and rows:
            lo, hi = con.execute(f"SELECT min({q(keys[0])}), max({q(keys[0])}) FROM {rel}").fetchall()[0]
        infos.append(PartitionInfo((f"{name}/{name}.{p}.parquet",), rows, lo, hi))
    info = with_widths(
        con, TableInfo(name, "parquet", cols, tuple(infos), kind=kind, keys=keys, hive=()), root
    )
    con.close()
    catalog = Catalog.open_or_create(root)
    catalog.put(info)
    catalog.save()
    return info


def _splitters(con: duckdb.DuckDBPyConnection, key: str, partitions: int) -> list[str]:
    """Upper bounds of all partitions but the last, from the distinct keys of table ``src``, so
    that equal keys share a partition (NULLs go to partition 0, as the loader puts them)."""
    distinct = f"SELECT DISTINCT {q(key)} AS k FROM src WHERE k IS NOT NULL"
    rows = con.execute(f"SELECT CAST(k AS VARCHAR) FROM ({distinct}) ORDER BY k").fetchall()
    picks = sorted({(i + 1) * len(rows) // partitions - 1 for i in range(partitions - 1)})
    return [rows[i][0] for i in picks if 0 <= i < len(rows) - 1]


def oracle(data: str | os.PathLike[str], threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """Single-process DuckDB over all of a data directory's files, one view per catalog table, read
    the way the ranks read it: the ground truth. ``threads``: DuckDB's default (every core) if None."""
    catalog = Catalog.load(data)
    con = duckdb.connect(config={"threads": threads} if threads else {})
    for name, info in catalog.tables.items():
        files = [catalog.path(f) for p in info.partitions for f in p.files]
        if files:
            source = read_table_files(info, files)
        else:  # no file at all (zero rows loaded): the schema from the catalog
            source = (
                "(SELECT " + ", ".join(f"CAST(NULL AS {t}) AS {q(c)}" for c, t in info.columns) + " LIMIT 0)"
            )
        con.execute(f"CREATE VIEW {q(name)} AS SELECT * FROM {source}")
    return con
