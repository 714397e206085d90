"""SQL fragments outside a plan node: how files are read, which partition or rank a row goes to,
and the wrappers that add those columns to a stage's query. Written here, beside ``render``, so
that exec/, ingest/ and catalog/ call functions instead of formatting SQL themselves."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from duckflock.catalog.partitioning import Hashed, Partitioning, Ranged, canonical_hash_type
from duckflock.sqltext import quote_ident as q
from duckflock.sqltext import sql_literal

if TYPE_CHECKING:  # the catalog imports this module (its hash canary)
    from duckflock.catalog import TableInfo

TARGET_COLUMN = "__target"  # a routed row's receiving rank, added to the producing query
KEY_HASH_COLUMN = "__khash"  # a row's join key hash, just before the target (exec/skew.py)

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


# ---- partition and rank of a row ----------------------------------------------------------------


def hash_sql(key_sql: list[str], key_types: tuple[str, ...], count: int) -> str:
    """SQL computing the partition number of a row: DuckDB's deterministic hash of the cast keys."""
    casts = ", ".join(f"CAST({k} AS {t})" for k, t in zip(key_sql, key_types, strict=True))
    return f"(hash({casts}) % {count})"


def range_partition_sql(key: str, key_type: str, splitters: list[str]) -> str:
    """Partition of a row: the number of splitters below its key. NULL keys go to partition 0."""
    if not splitters:
        return "0"
    k = q(key)
    whens = " ".join(
        f"WHEN {k} <= CAST({sql_literal(s)} AS {key_type}) THEN {i}" for i, s in enumerate(splitters)
    )
    return f"(CASE WHEN {k} IS NULL THEN 0 {whens} ELSE {len(splitters)} END)"


def target_sql(keys: tuple[str, ...], target: Partitioning, size: int) -> str:
    """SQL computing each row's target rank from its ``keys``, evaluated by DuckDB inside the
    producing query, so that rows land on the rank of ``target`` partition they belong to."""
    return f"CAST({partition_sql(keys, target)} % {size} AS USMALLINT)"


def partition_sql(keys: tuple[str, ...], target: Partitioning) -> str:
    """SQL computing the number of the ``target`` partition each row belongs to, from its ``keys``."""
    if isinstance(target, Hashed):
        return f"({key_hash_sql(keys, target)} % {target.count})"
    if isinstance(target, Ranged):
        # Partition p holds keys up to its upper bound; keys in no partition's range match nothing
        # on the other side, so any partition is correct for them.
        bounds = sorted((b[1], p) for p, b in enumerate(target.bounds) if b is not None)
        if not bounds:  # every partition empty: the other side's keys match nothing anywhere
            return "0"
        # Compare in the key's canonical type: the other side's keys may not fit the range key's type.
        key = f"CAST({keys[0]} AS {canonical_hash_type(target.key_type)})"
        whens = " ".join(f"WHEN {key} <= {sql_literal(hi)} THEN {p}" for hi, p in bounds)
        last = bounds[-1][1]
        # NULL keys where a loaded table keeps them (range_partition_sql): a group of NULLs meets.
        return f"(CASE WHEN {key} IS NULL THEN 0 {whens} ELSE {last} END)"
    raise ValueError(f"no partition function for {target.describe()}")


def key_hash_sql(keys: tuple[str, ...], target: Hashed) -> str:
    """DuckDB's deterministic hash of a row's ``keys`` cast to ``target``'s key types (as they are
    when it has none): what places the row in ``target``."""
    if all(t == "" for t in target.key_types):  # hashed as they are, no cast
        return f"hash({', '.join(keys)})"
    casts = ", ".join(f"CAST({k} AS {t})" for k, t in zip(keys, target.key_types, strict=True))
    return f"hash({casts})"


def _join_key_hash(keys: tuple[str, ...], target: Partitioning) -> str:
    """The hash naming a join key: as ``target`` hashes it, or for a range, of the key in its
    canonical type (both sides of a join name a key alike)."""
    if isinstance(target, Ranged):
        target = Hashed((target.key,), (canonical_hash_type(target.key_type),), target.count)
    assert isinstance(target, Hashed)
    return key_hash_sql(keys, target)


def with_key_hash(query: str, keys: tuple[str, ...], target: Partitioning) -> str:
    """The query's rows with the hash of their join ``keys`` appended (exec/skew.py)."""
    return f"SELECT *, {_join_key_hash(keys, target)} AS {KEY_HASH_COLUMN} FROM ({query})"


def with_key_hashes(
    query: str, keys: tuple[str, ...], target: Partitioning, hashes: Iterable[int], among: bool
) -> str:
    """The query's rows whose join ``keys`` hash to one of ``hashes`` (``among``) or to none."""
    listed = ", ".join(f"{h}::UBIGINT" for h in hashes)
    op = "IN" if among else "NOT IN"
    return f"SELECT * FROM ({query}) WHERE {_join_key_hash(keys, target)} {op} ({listed})"


def with_target(query: str, target: str) -> str:
    """The query's rows with their target rank appended as the last column."""
    return f"SELECT *, {target} AS {TARGET_COLUMN} FROM ({query})"


def own_share(query: str, rank: int) -> str:
    """Only the rows of a routed query whose target is ``rank``."""
    return f"SELECT * FROM ({query}) WHERE {TARGET_COLUMN} = {rank}"


def everything(table: str) -> str:
    return f"SELECT * FROM {table}"


# ---- splitters of a parallel sort ---------------------------------------------------------------

SortKey = tuple[str, bool, bool]  # (expression SQL, descending, nulls first)
SPLITTERS_TABLE = "__splitters"  # one row per splitter: k0, k1, ... and its target __t


def sort_key_sample(table: str, keys: list[SortKey], rows: int) -> str:
    """A repeatable reservoir sample of the sort keys as columns k0, k1, ..."""
    exprs = ", ".join(f"{e} AS k{i}" for i, (e, _, _) in enumerate(keys))
    return f"SELECT {exprs} FROM {table} USING SAMPLE reservoir({rows} ROWS) REPEATABLE (7)"


def ordered_samples(table: str, keys: list[SortKey]) -> str:
    """The sample columns k0, k1, ... of ``table`` in the sort's order."""
    order = ", ".join(
        f"k{i}{' DESC' if d else ''}{' NULLS FIRST' if nf else ' NULLS LAST'}"
        for i, (_, d, nf) in enumerate(keys)
    )
    return f"SELECT * FROM {table} ORDER BY {order}"


def splitter_target_sql(keys: list[SortKey], null_keys: list[list[bool]]) -> str:
    """Each row's target rank: the number of splitters it sorts after. Splitter ``t`` (1-based) is
    read from ``SPLITTERS_TABLE``, so no value is written out as text; ``null_keys[t - 1][i]``
    says whether its key ``i`` is NULL."""
    whens = []
    for target in range(len(null_keys), 0, -1):
        splitter = [
            None if null else f"(SELECT k{i} FROM {SPLITTERS_TABLE} WHERE __t = {target})"
            for i, null in enumerate(null_keys[target - 1])
        ]
        whens.append(f"WHEN {_after(keys, splitter)} THEN {target}")
    return f"CAST(CASE {' '.join(whens)} ELSE 0 END AS USMALLINT)"


def one_target(rank: int = 0) -> str:
    return f"CAST({rank} AS USMALLINT)"


def _after(row: list[SortKey], splitter: list[str | None]) -> str:
    """SQL that is true when the row sorts strictly after the splitter."""
    clause = "FALSE"
    for (expr, desc, nulls_first), s in reversed(list(zip(row, splitter, strict=True))):
        if s is None:
            gt = f"({expr} IS NOT NULL)" if nulls_first else "FALSE"
            eq = f"({expr} IS NULL)"
        else:
            op = "<" if desc else ">"
            gt = (
                f"({expr} IS NOT NULL AND {expr} {op} {s})"
                if nulls_first
                else f"({expr} IS NULL OR {expr} {op} {s})"
            )
            eq = f"COALESCE({expr} = {s}, FALSE)"
        clause = f"({gt} OR ({eq} AND {clause}))"
    return clause


# ---- writing partitions --------------------------------------------------------------------------


def copy_schema_probe(source: str, path: str) -> str:
    """Write zero rows of ``source`` as Parquet: the schema readers of its partitions will see."""
    return f"COPY {no_rows(source)} TO {sql_literal(path)} (FORMAT parquet)"


def copy_partitioned(source: str, column: str, directory: str) -> str:
    """Write the rows of ``source`` as Parquet, one hive-style directory per value of its partition
    number ``column``."""
    to = sql_literal(directory)
    return f"COPY (SELECT * FROM {source}) TO {to} (FORMAT parquet, PARTITION_BY ({q(column)}))"
