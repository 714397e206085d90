"""Files in hive ``key=value`` directories registered in place as a table hash-partitioned on ``key``.

Every file under ``k=v/`` holds only rows with ``k = v`` (DuckDB reads the column from the path), so
the files of the values whose ``hash_sql`` bucket is ``b`` make partition ``b``, without rewriting a
file. Chosen with ``--hive-partitioning-key`` rather than whenever the layout has one hive column: a
load keeps the files' own partition count (one partition per file) unless asked, and a table on one
key joins co-located only with tables of the same partition count, which the user picks.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from duckflock.catalog import TableInfo
from duckflock.errors import CatalogError
from duckflock.exec.resources.runtime import Runtime
from duckflock.ingest.lake import data_files, place, register
from duckflock.ingest.load import DEFAULT_PARTITIONS, Input


def register_hive(
    rt: Runtime,
    qid: int,
    root: Path,
    table: str,
    source: Input,
    paths: list[str],
    key: str,
    partitions: int | None,
) -> TableInfo | None:
    """Register ``paths`` (read as ``source``) as ``table``, hash-partitioned on the hive column
    ``key`` into ``partitions`` (default 12) where DuckDB finds each file's rows in one bucket,
    else as unpartitioned (with a warning saying why)."""
    count = DEFAULT_PARTITIONS if partitions is None else partitions
    if count < 1:
        raise CatalogError(f"the number of partitions must be at least 1, not {count}")
    hive = {n.lower(): (n, t) for n, t in source.hive or ()}
    column = hive.get(key.lower())
    if column is None and rt.rank == 0:
        found = ", ".join(n for n, _ in source.hive or ()) or "none"
        warnings.warn(
            f"table {table!r} is registered as unpartitioned: {key!r} is not a hive partition column "
            f"of every input path (hive columns: {found})",
            stacklevel=2,
        )
    files, stamps = data_files(rt, qid, paths)
    placement = place(rt, qid, source.scan, files, column, count, table)
    return register(rt, root, table, source, files, placement, {}, stamps)
