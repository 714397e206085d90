"""SQL fragments outside a plan node: how files are read, and the wrappers that add a row's target
rank (computed by catalog/placement.py) or join key hash to a stage's query. Written here, beside
``render``, so that exec/ and ingest/ call functions instead of formatting SQL themselves."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

from duckflock.catalog import Partitioning, TableInfo
from duckflock.catalog.placement import join_key_hash
from duckflock.sqltext import quote_ident as q
from duckflock.sqltext import sql_literal

TARGET_COLUMN = "__target"  # a routed row's receiving rank, added to the producing query
KEY_HASH_COLUMN = "__khash"  # a row's join key hash, just before the target (exec/stages/skew.py)

# ---- reading files ---------------------------------------------------------------------------------

_GLOB_CHAR = re.compile(r"([*?\[])")


def literal_path(path: str | os.PathLike[str]) -> str:
    """``path`` as a DuckDB glob pattern matching only itself: DuckDB globs every path it reads, so
    a file named ``x[1].parquet`` would read ``x1.parquet``. Each glob character goes in brackets."""
    return _GLOB_CHAR.sub(r"[\1]", str(path))


def files_sql(paths: Iterable[str | os.PathLike[str]]) -> str:
    """A SQL list of ``paths``, each matched literally by DuckDB's file readers."""
    return sql_literal([literal_path(p) for p in paths])


def read_files(
    fmt: str,
    paths: Iterable[str | os.PathLike[str]],
    csv_options: dict[str, object] | None = None,
    columns: Sequence[tuple[str, str]] | None = None,
    hive: Sequence[tuple[str, str]] | None = (),
) -> str:
    """The DuckDB table function reading ``paths``, e.g. ``read_parquet(['a.parquet'])``.

    CSV is read with the options ``csv_options`` and the column names and types ``columns``, the
    way the executor reads a CSV table of the catalog; Parquet with ``union_by_name`` among them
    (lake tables) by column name, in those types. ``hive``: the hive partition columns the
    paths give, with their types; () reads none, None leaves it to DuckDB's auto-detection.
    """
    files = files_sql(paths)
    opts = _hive_options(hive)
    if fmt == "parquet":
        if (csv_options or {}).get("union_by_name") and columns:
            return _by_name_parquet(files, opts, columns)
        return f"read_parquet({files}{opts})"
    opts += "".join(f", {k} = {sql_literal(v)}" for k, v in (csv_options or {}).items())
    if not columns:
        return f"read_csv({files}{opts})"
    if (csv_options or {}).get("auto_detect") is False:  # a dialect fixed by catalogs written before
        return f"read_csv({files}, columns = {sql_literal(dict(columns))}{opts})"
    return _sniffed_csv(files, opts, columns, hive)


def _sniffed_csv(files: str, opts: str, columns: Sequence[tuple[str, str]], hive: Sequence | None) -> str:
    """CSV files read as DuckDB reads them together: each file's dialect and header sniffed, its
    columns matched by name and cast to the types DuckDB chose over all the files."""
    partition_columns = {n for n, _ in hive or ()}
    types = {n: t for n, t in columns if n not in partition_columns}
    select = ", ".join(q(n) for n, _ in columns)
    return f"(SELECT {select} FROM read_csv({files}, types = {sql_literal(types)}{opts}))"


def _by_name_parquet(files: str, opts: str, columns: Sequence[tuple[str, str]]) -> str:
    """Parquet files of a table whose schema evolved (Delta, Iceberg), matched by column name: a
    column a file lacks reads as NULL, one the table dropped is left out, and each column has the
    table's current type, whichever files a rank reads (a union over an empty relation of those
    types gives every column even where none of the files has it)."""
    select = ", ".join(f"CAST({q(n)} AS {t}) AS {q(n)}" for n, t in columns)
    return (
        f"(SELECT {select} FROM ({typed_empty(columns)} UNION ALL BY NAME "
        f"SELECT * FROM read_parquet({files}, union_by_name = true{opts})))"
    )


def _hive_options(hive: Sequence[tuple[str, str]] | None) -> str:
    if hive is None:
        return ""
    if not hive:
        return ", hive_partitioning = false"
    return f", hive_partitioning = true, hive_types = {sql_literal(dict(hive))}"


def read_table_files(info: TableInfo, paths: Iterable[str | os.PathLike[str]]) -> str:
    """The DuckDB table function reading ``paths`` of the catalog table ``info``, as ranks read it."""
    return read_files(info.format, paths, info.csv_options, info.columns, info.hive)


def no_rows(relation: str) -> str:
    """A relation with the schema of ``relation`` and no rows."""
    return f"(SELECT * FROM {relation} LIMIT 0)"


def typed_empty(columns: Sequence[tuple[str, str]]) -> str:
    """An empty relation with these (name, DuckDB type) columns: a table without any file."""
    cols = ", ".join(f"CAST(NULL AS {t}) AS {q(c)}" for c, t in columns)
    return f"(SELECT {cols} LIMIT 0)"


# ---- routing a stage's rows ---------------------------------------------------------------------


def with_key_hash(query: str, keys: tuple[str, ...], target: Partitioning) -> str:
    """The query's rows with the hash of their join ``keys`` appended (exec/stages/skew.py)."""
    return f"SELECT *, {join_key_hash(keys, target)} AS {KEY_HASH_COLUMN} FROM ({query})"


def with_key_hashes(
    query: str, keys: tuple[str, ...], target: Partitioning, hashes: Iterable[int], among: bool
) -> str:
    """The query's rows whose join ``keys`` hash to one of ``hashes`` (``among``) or to none."""
    listed = ", ".join(f"{h}::UBIGINT" for h in hashes)
    op = "IN" if among else "NOT IN"
    return f"SELECT * FROM ({query}) WHERE {join_key_hash(keys, target)} {op} ({listed})"


def with_target(query: str, target: str) -> str:
    """The query's rows with their target rank appended as the last column."""
    return f"SELECT *, {target} AS {TARGET_COLUMN} FROM ({query})"


def own_share(query: str, rank: int) -> str:
    """Only the rows of a routed query whose target is ``rank``."""
    return f"SELECT * FROM ({query}) WHERE {TARGET_COLUMN} = {rank}"


def everything(table: str) -> str:
    return f"SELECT * FROM {table}"


# ---- writing partitions --------------------------------------------------------------------------


def copy_schema_probe(source: str, path: str) -> str:
    """Write zero rows of ``source`` as Parquet: the schema readers of its partitions will see."""
    return f"COPY {no_rows(source)} TO {sql_literal(path)} (FORMAT parquet)"


def copy_partitioned(source: str, column: str, directory: str) -> str:
    """Write the rows of ``source`` as Parquet, one hive-style directory per value of its partition
    number ``column``."""
    to = sql_literal(directory)
    return f"COPY (SELECT * FROM {source}) TO {to} (FORMAT parquet, PARTITION_BY ({q(column)}))"
