"""An Iceberg table registered in place: the data files of one snapshot, planned by pyiceberg.

Rank 0 opens the catalog (a SQL catalog, e.g. ``sqlite:///cat.db``; an http(s) URI is a REST
catalog) and tells every rank the snapshot's files. Iceberg keeps partition columns in the data
files, which are read without hive columns. A table whose every file has an identity partition
spec on one and the same column is hash-partitioned on it (ingest/lake.py); a bucket transform is
not duckflock's hash (Iceberg's is murmur3), so such a table is spread by bytes.

Refused, never read wrongly: delete files (position or equality deletes), files other than
Parquet, files whose columns carry other names than the table's (a renamed column: duckflock reads
columns by name, not by Iceberg's field ids), files that are gone.
"""

from __future__ import annotations

import warnings
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
    iceberg_properties,
    local_path,
    object_stamps,
    place,
    register,
)
from duckflock.ingest.load import DEFAULT_PARTITIONS, Columns, Input, _root_cause, table_name
from duckflock.plan.sql_text import files_sql, read_files


@dataclass(frozen=True)
class IcebergSnapshot:
    """What rank 0 planned, sent to every rank."""

    table: str
    snapshot: int | None  # None: the table has no snapshot (no rows)
    columns: Columns
    field_ids: dict[str, int]  # the schema's top-level columns
    all_ids: frozenset[int]  # nested fields' too
    key: str | None  # the one identity partition column of every file
    files: list[DataFile]
    rows: list[int | None]  # each file's record count


def load_iceberg(
    rt: Runtime,
    qid: int,
    catalog_dir: str,
    name: str,
    catalog_uri: str,
    identifier: str,
    snapshot: int | None = None,
    partitions: int | None = None,
    catalog_name: str = "default",
) -> TableInfo | None:
    """Register snapshot ``snapshot`` (default: the current one) of Iceberg table ``identifier``
    (``namespace.table``) of the catalog at ``catalog_uri`` as table ``name``; call on every rank.
    ``catalog_name``: the catalog's name, which a SQL catalog keeps its tables under."""
    with _root_cause(rt, qid):
        table = table_name(name)
        count = DEFAULT_PARTITIONS if partitions is None else partitions
        if count < 1:
            raise CatalogError(f"the number of partitions must be at least 1, not {count}")
        planned = plan(catalog_uri, catalog_name, identifier, snapshot, table) if rt.rank == 0 else None
        snap = rt.mux.allgather(qid, planned)[0]
        assert snap is not None
        what = f"Iceberg table {snap.table} snapshot {snap.snapshot}"
        source = Input("parquet", dict(BY_NAME), snap.columns, ())

        def scan(paths: list[str]) -> str:
            return read_files("parquet", paths, BY_NAME, snap.columns, ())

        mine = [snap.files[i].path for i in range(rt.rank, len(snap.files), rt.size)]
        check_present(mine, what)
        check_field_names(rt.con, mine, snap, what)
        key = (snap.key, dict(snap.columns)[snap.key]) if snap.key else None
        placement = place(rt, qid, scan, snap.files, key, count, table)
        origin: dict[str, object] = {
            "format": "iceberg",
            "catalog": catalog_uri,
            "catalog_name": catalog_name,
            "table": snap.table,
            "snapshot": snap.snapshot,
            "follow": snapshot is None,  # queries read the current snapshot (ingest/versions.py)
            "partitions": count,
        }
        stamps = object_stamps(rt, qid, [f.path for f in snap.files])
        return register(rt, Path(catalog_dir).resolve(), table, source, snap.files, placement, origin, stamps)


def open_table(catalog_uri: str, catalog_name: str, identifier: str) -> Any:
    from pyiceberg.catalog import load_catalog

    rest = catalog_uri.startswith(("http://", "https://"))
    kind = {"py-catalog-impl": "duckflock.ingest.iceberg_rest.TimedRestCatalog"} if rest else {"type": "sql"}
    try:
        # The S3 settings apply where the table's files are objects (unused otherwise).
        catalog = load_catalog(catalog_name, uri=catalog_uri, **kind, **iceberg_properties())
        return catalog.load_table(identifier)
    except Exception as e:  # pyiceberg's and SQLAlchemy's errors: no catalog, no such table
        raise CatalogError(f"cannot open Iceberg table {identifier} of {catalog_uri}: {e}") from e


def plan(
    catalog_uri: str, catalog_name: str, identifier: str, snapshot_id: int | None, table: str
) -> IcebergSnapshot:
    """The files of the snapshot and how to read them (rank 0)."""
    return files_of(open_table(catalog_uri, catalog_name, identifier), identifier, snapshot_id, table)


def files_of(tbl: Any, identifier: str, snapshot_id: int | None, table: str) -> IcebergSnapshot:
    """The files of snapshot ``snapshot_id`` (default: the current one) of pyiceberg's ``tbl``."""
    import pyarrow as pa
    from pyiceberg.schema import index_by_id
    from pyiceberg.transforms import IdentityTransform

    snap = tbl.current_snapshot() if snapshot_id is None else tbl.snapshot_by_id(snapshot_id)
    if snap is None and snapshot_id is not None:
        raise CatalogError(f"Iceberg table {identifier} has no snapshot {snapshot_id}")
    # The columns as of the snapshot (time travel reads the table as it was).
    schema = tbl.schema()
    if snap is not None and snap.schema_id is not None:
        schema = tbl.schemas().get(snap.schema_id, schema)
    what = f"Iceberg table {identifier} snapshot {snap.snapshot_id if snap else None}"
    tasks = list(tbl.scan(snapshot_id=snap.snapshot_id).plan_files()) if snap else []
    for t in tasks:
        if t.delete_files:
            raise CatalogError(
                f"{what} has delete files (rows deleted outside {t.file.file_path}), which duckflock "
                "cannot apply: compact the table (rewrite its data files) to register it"
            )
        if str(t.file.file_format).upper().rsplit(".", 1)[-1] != "PARQUET":
            raise CatalogError(f"{what}: data file {t.file.file_path} is {t.file.file_format}, not Parquet")
    rel = duckdb.from_arrow(pa.schema(schema.as_arrow()).empty_table())
    columns = tuple((c, str(t)) for c, t in zip(rel.columns, rel.types, strict=True))
    specs = tbl.specs()
    keys = set()
    for t in tasks:
        fields = specs[t.file.spec_id].fields
        identity = len(fields) == 1 and isinstance(fields[0].transform, IdentityTransform)
        keys.add(schema.find_column_name(fields[0].source_id) if identity else None)
    key = keys.pop() if len(keys) == 1 else None
    if key is None and any(specs[t.file.spec_id].fields for t in tasks):  # partitioned otherwise
        warnings.warn(
            f"table {table!r} is registered as unpartitioned: the files of {what} are not all "
            "partitioned by identity on one column (a bucket transform hashes with murmur3, not "
            "DuckDB's hash)",
            stacklevel=2,
        )
    files = [DataFile(local_path(t.file.file_path), int(t.file.file_size_in_bytes)) for t in tasks]
    field_ids = {f.name: f.field_id for f in schema.fields}
    all_ids = frozenset(index_by_id(schema))
    snapshot = snap.snapshot_id if snap else None
    rows: list[int | None] = [int(t.file.record_count) for t in tasks]
    return IcebergSnapshot(identifier, snapshot, columns, field_ids, all_ids, key, files, rows)


def check_field_names(
    con: duckdb.DuckDBPyConnection, paths: list[str], snap: IcebergSnapshot, what: str
) -> None:
    """Each file's columns of the table's field ids must have the table's names: duckflock reads
    columns by name, so a renamed column (or one dropped and added again) would read wrongly."""
    if not paths:
        return
    names = {i: n for n, i in snap.field_ids.items()}
    try:
        query = f"SELECT file_name, name, field_id FROM parquet_schema({files_sql(paths)})"
        rows = con.execute(query + " WHERE field_id IS NOT NULL").fetchall()
    except duckdb.Error as e:
        raise CatalogError(f"{what}: cannot read the data files: {e}") from e
    for path, column, field_id in rows:
        expected = names.get(field_id)
        own = snap.field_ids.get(column, field_id)
        stale = field_id != own and field_id not in snap.all_ids  # dropped, then a column of its name added
        if (expected is not None and expected != column) or stale:
            raise CatalogError(
                f"{what}: data file {path} has column {column!r} as field {field_id}, which the "
                "table names otherwise (a renamed column): duckflock reads columns by name; not supported"
            )
