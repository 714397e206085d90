"""A Delta Lake table registered in place: the data files of one version, from its transaction log.

Rank 0 reads the log (delta-rs) and tells every rank the version's files, so all agree on one
version even while the table is written to. Partition columns are not in Delta's data files: DuckDB
reads them from the ``key=value`` directories delta-rs writes, and every file's values there are
checked against the log's before the table is recorded. A table partitioned on one column is
hash-partitioned on it (ingest/lake.py); others are spread over partitions by bytes.

Refused, never read wrongly: deletion vectors (rows the log deletes inside a file; duckflock cannot
apply them), column mapping (files name columns otherwise than the table does), files that are gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from duckflock.catalog import TableInfo
from duckflock.errors import CatalogError
from duckflock.exec.resources.runtime import Runtime
from duckflock.ingest.lake import (
    BY_NAME,
    DataFile,
    check_present,
    delta_storage_options,
    local_path,
    object_stamps,
    place,
    register,
)
from duckflock.ingest.load import DEFAULT_PARTITIONS, Columns, Input, _root_cause, table_name
from duckflock.plan.sql_text import read_files
from duckflock.sqltext import quote_ident
from duckflock.storage.objects import is_uri


@dataclass(frozen=True)
class DeltaVersion:
    """What rank 0 read from the log, sent to every rank."""

    uri: str
    version: int
    columns: Columns
    partition_columns: tuple[str, ...]
    files: list[DataFile]
    values: list[tuple[Any, ...]]  # each file's partition values, in partition_columns' order
    rows: list[int | None]  # each file's, from the log's statistics (None: not recorded)


def load_delta(
    rt: Runtime,
    qid: int,
    catalog_dir: str,
    name: str,
    uri: str,
    version: int | None = None,
    partitions: int | None = None,
) -> TableInfo | None:
    """Register version ``version`` (default: the latest) of the Delta table at ``uri`` as table
    ``name``; call on every rank. The TableInfo on rank 0, None elsewhere."""
    with _root_cause(rt, qid):
        table = table_name(name)
        count = DEFAULT_PARTITIONS if partitions is None else partitions
        if count < 1:
            raise CatalogError(f"the number of partitions must be at least 1, not {count}")
        snap = rt.mux.allgather(qid, read_log(uri, version) if rt.rank == 0 else None)[0]
        assert snap is not None
        what = f"Delta table {snap.uri} version {snap.version}"
        hive = tuple((c, t) for c, t in snap.columns if c in snap.partition_columns)
        source = Input("parquet", dict(BY_NAME), snap.columns, hive)

        def scan(paths: list[str]) -> str:
            return read_files("parquet", paths, BY_NAME, snap.columns, hive)

        paths = [f.path for f in snap.files]
        mine = list(range(rt.rank, len(paths), rt.size))
        check_present([paths[i] for i in mine], what)
        if hive:
            check_partition_values(rt.con, scan, snap, mine, what)
        key = hive[0] if len(hive) == 1 else None
        placement = place(rt, qid, scan, snap.files, key, count, table)
        # "follow": queries read the latest version (ingest/versions.py); "partitions": how many a
        # later version is spread over.
        origin: dict[str, object] = {"format": "delta", "uri": snap.uri, "version": snap.version}
        origin |= {"follow": version is None, "partitions": count}
        stamps = object_stamps(rt, qid, paths)
        return register(rt, Path(catalog_dir).resolve(), table, source, snap.files, placement, origin, stamps)


def read_log(uri: str, version: int | None) -> DeltaVersion:
    """The files of that version of the table and what is needed to read them (rank 0)."""
    return files_of(open_log(uri, version), uri)


def open_log(uri: str, version: int | None = None) -> Any:
    """delta-rs's DeltaTable at that version (default the latest), or CatalogError naming the
    table and the version."""
    from deltalake import DeltaTable

    at = "" if version is None else f" at version {version}"
    options = delta_storage_options() if is_uri(uri) else None
    try:
        dt = DeltaTable(uri, version=version, storage_options=options)
    except Exception as e:  # deltalake raises its own DeltaError kinds (no table, no such version)
        raise CatalogError(f"cannot open the Delta table {uri}{at}: {e}") from e
    return dt


def files_of(dt: Any, uri: str) -> DeltaVersion:
    """The files of the version ``dt`` is at, and what is needed to read them."""
    import pyarrow as pa

    what = f"Delta table {uri} version {dt.version()}"
    config = dt.metadata().configuration
    if config.get("delta.columnMapping.mode", "none") != "none":
        raise CatalogError(f"{what} uses column mapping (its files name columns otherwise): not supported")
    actions = pa.table(dt.get_add_actions(flatten=True))
    _refuse_deletion_vectors(dt, what)
    schema = pa.schema(dt.schema().to_arrow())
    rel = duckdb.from_arrow(schema.empty_table())
    columns = tuple((c, str(t)) for c, t in zip(rel.columns, rel.types, strict=True))
    partition_columns = tuple(dt.metadata().partition_columns)
    uris = dt.file_uris()
    if len(uris) != actions.num_rows:
        raise CatalogError(f"{what}: its log lists {actions.num_rows} files but {len(uris)} file URIs")
    sizes = actions.column("size_bytes").to_pylist()
    values = [
        tuple(actions.column(f"partition.{c}")[i].as_py() for c in partition_columns)
        for i in range(actions.num_rows)
    ]
    files = [DataFile(local_path(u), int(s or 0)) for u, s in zip(uris, sizes, strict=True)]
    rows = actions.column("num_records").to_pylist() if "num_records" in actions.column_names else []
    rows = rows or [None] * len(files)
    return DeltaVersion(uri, dt.version(), columns, partition_columns, files, values, rows)


def _refuse_deletion_vectors(dt: Any, what: str) -> None:
    """Rows deleted by a deletion vector are still in their file: reading the file would return them."""
    import pyarrow as pa

    if "deletionVectors" not in set(dt.protocol().reader_features or ()):
        return
    try:
        found = pa.RecordBatchReader.from_stream(dt.deletion_vectors()).read_all().num_rows
    except Exception as e:  # delta-rs cannot read them: neither can duckflock tell which rows go
        raise CatalogError(f"{what} has deletion vectors, which duckflock cannot apply ({e})") from e
    if found:
        raise CatalogError(
            f"{what} has deletion vectors (rows deleted inside their files), which duckflock cannot "
            "apply: rewrite its files without them (e.g. OPTIMIZE/purge) to register it"
        )


def check_partition_values(
    con: duckdb.DuckDBPyConnection, scan: Any, snap: DeltaVersion, mine: list[int], what: str
) -> None:
    """DuckDB reads each file's partition values from its path: they must be the log's."""
    cols = ", ".join(quote_ident(c) for c in snap.partition_columns)
    for i in mine:
        path = snap.files[i].path
        try:
            found = con.execute(f"SELECT DISTINCT {cols} FROM {scan([path])}").fetchall()
        except duckdb.Error as e:
            raise CatalogError(f"{what}: cannot read data file {path}: {e}") from e
        if found and found != [snap.values[i]]:
            raise CatalogError(
                f"{what}: data file {path} has the partition values {found[0]} in its path but "
                f"{snap.values[i]} in the log (duckflock reads them from key=value directories)"
            )
