"""Which version of a Delta or Iceberg table a query reads: resolved once per query, on rank 0,
before planning, so that every rank reads the files of one version whatever is committed meanwhile.

A table registered without a version follows the table: each query asks the log (delta-rs, updated
incrementally) or the catalog (pyiceberg, the table's metadata refreshed) for the latest version. A
table registered at a version stays there. ``t VERSION AS OF n`` reads version n (sql/time_travel.py).

Cheap when nothing changed: at the registered version the catalog's TableInfo is used as it is, and
a version planned before is reused. Another version keeps the partition of every file the registered
one has too and reads only its other files, on rank 0: that they are there, their hash bucket (a
table hash-partitioned on a key; a file holding several buckets spreads the version by bytes), their
partition values or column names, rows where the metadata lacks them, and an object's ETag.
"""

from __future__ import annotations

import datetime as dt
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import duckdb

from duckflock.catalog import Catalog, PartitionInfo, TableInfo
from duckflock.catalog.catalog import shown, versioned_name
from duckflock.errors import CatalogError
from duckflock.ingest import delta, iceberg
from duckflock.ingest.lake import (
    BY_NAME,
    DataFile,
    balanced,
    bucket_sql,
    check_present,
    file_bucket,
    stored_path,
)
from duckflock.ingest.load import Columns, parquet_stats
from duckflock.plan.sql_text import read_files
from duckflock.sql.time_travel import references, rewrite
from duckflock.storage import objects

# What may be time travel in a query's text (sql/time_travel.py finds it for sure).
_TIME_TRAVEL = re.compile(r"\bAS\s+OF\b|=>", re.IGNORECASE)


@dataclass(frozen=True)
class QueryTables:
    text: str  # the query, time travel turned into tables of their own (``t@3 AS t``)
    catalog: Catalog  # with each lake table the query reads at its version
    read_at: tuple[str, ...]  # "t: Delta version 5", for EXPLAIN and --profile


@dataclass(frozen=True)
class Version:
    """One version of a lake table as its metadata lists it, with the checks its new files need."""

    number: int | None  # Delta version, Iceberg snapshot id (None: a table without snapshots)
    columns: Columns
    files: list[DataFile]
    rows: list[int | None]  # per file, from the metadata (None: not there)
    key: str | None  # the one partition column every file is partitioned by, if any
    check: Callable[[duckdb.DuckDBPyConnection, list[int]], None]  # of the files of these indexes


def label(info: TableInfo) -> str:
    """``Delta version 5`` / ``Iceberg snapshot 123``: what a lake table is read at ('' otherwise)."""
    fmt = info.source.get("format")
    return _label(str(fmt), _number(info)) if fmt in ("delta", "iceberg") else ""


def _label(fmt: str, number: object) -> str:
    return f"Delta version {number}" if fmt == "delta" else f"Iceberg snapshot {number}"


def _number(info: TableInfo) -> object:
    return info.source.get("version" if info.source.get("format") == "delta" else "snapshot")


class LakeVersions:
    """Rank 0's: the TableInfo of the version of a lake table a query reads. Made anew when the
    catalog changes (the handles and plans kept are those of its tables)."""

    def __init__(self, root: Path, con: duckdb.DuckDBPyConnection):
        self.root = root
        self.con = con  # rank 0's DuckDB, free while a query is planned
        self._handles: dict[str, Any] = {}  # table name -> DeltaTable or pyiceberg Table (following)
        self._planned: dict[tuple[str, object], TableInfo] = {}

    def latest(self, info: TableInfo) -> TableInfo:
        """The table at its latest version, or as registered where it does not follow its source."""
        if not info.source.get("follow"):
            return info
        handle = self._handles.get(info.name)
        if info.source["format"] == "delta":
            if handle is None:
                handle = self._handles[info.name] = delta.open_log(str(info.source["uri"]))
            else:
                try:
                    handle.update_incremental()  # reads only the commits since
                except Exception as e:  # delta-rs's DeltaError kinds
                    raise CatalogError(f"cannot read the log of Delta table {info.source['uri']}: {e}") from e
            number: object = handle.version()
        else:
            if handle is None:
                handle = self._handles[info.name] = iceberg.open_table(*_iceberg_names(info))
            else:
                try:
                    handle.refresh()  # the catalog's current metadata
                except Exception as e:
                    raise CatalogError(f"cannot refresh Iceberg table {info.source['table']}: {e}") from e
            snap = handle.current_snapshot()
            number = snap.snapshot_id if snap else None
        return self._at(info, info.name, number, lambda: _version_of(info, handle, number))

    def for_query(self, sql: str, catalog: Catalog) -> QueryTables:
        """The tables ``sql`` reads, each lake table at the version it reads (one per query)."""
        lake = {n for n, t in catalog.tables.items() if t.source.get("format") in ("delta", "iceberg")}
        if not lake and not _TIME_TRAVEL.search(sql):  # nothing to parse for
            return QueryTables(sql, catalog, ())
        refs = references(sql)
        if refs is None:  # sqlglot cannot read it: the driver answers it from the catalog's version
            return QueryTables(sql, catalog, ())
        tables = dict(catalog.tables)
        read = [n for n in lake if n.lower() in refs.tables]
        for name in read:
            tables[name] = self.latest(catalog.tables[name])
        pinned = [self.as_of(catalog.table(ref.table), ref.value) for ref in refs.as_of]
        tables.update((t.name, t) for t in pinned)
        text = rewrite(sql, refs.as_of, [t.name for t in pinned]) if pinned else sql
        read_at = sorted({f"{shown(n)}: {label(tables[n])}" for n in [*read, *(t.name for t in pinned)]})
        return QueryTables(text, Catalog(catalog.root, tables, catalog.meta), tuple(read_at))

    def as_of(self, info: TableInfo, value: int | str) -> TableInfo:
        """The table at version or snapshot ``value`` (a number; text: the one current at that
        timestamp), as table ``name@number``; CatalogError naming the table and version where there
        is none."""
        fmt = info.source.get("format")
        if fmt not in ("delta", "iceberg"):
            raise CatalogError(
                f"table {info.name!r} is not a Delta or Iceberg table: it has no versions to read AS OF"
            )
        try:
            if fmt == "delta":
                uri = str(info.source["uri"])
                at = value if isinstance(value, int) else _version_at(uri, info, _timestamp(value))
                handle = delta.open_log(uri, at)
                number: object = handle.version()
            else:
                handle = self._handles.get(info.name) or iceberg.open_table(*_iceberg_names(info))
                number = value if isinstance(value, int) else _snapshot_at(handle, info, _timestamp(value))
                if handle.snapshot_by_id(number) is None:
                    raise CatalogError(f"Iceberg table {info.source['table']} has no snapshot {number}")
        except CatalogError as e:
            what = "VERSION" if isinstance(value, int) else "TIMESTAMP"
            raise CatalogError(f"table {info.name!r} {what} AS OF {value!r}: {e}") from None
        name = versioned_name(info.name, number)
        pinned = replace(info, name=name, source={**info.source, "follow": False})
        return self._at(pinned, name, number, lambda: _version_of(info, handle, number))

    def _at(self, info: TableInfo, name: str, number: object, version: Callable[[], Version]) -> TableInfo:
        if number == _number(info):
            return info
        key = (name, number)
        if key not in self._planned:
            self._planned[key] = replan(self.con, self.root, info, version())
        return self._planned[key]


def replan(con: duckdb.DuckDBPyConnection, root: Path, base: TableInfo, version: Version) -> TableInfo:
    """``base`` (the table as registered) at another version: files both have stay in their
    partition; the others are read here (see the module's doc)."""
    fmt = str(base.source["format"])
    what = f"table {shown(base.name)!r} ({_label(fmt, version.number)})"
    names = [stored_path(root, f.path) for f in version.files]
    where = {f: p for p, part in enumerate(base.partitions) for f in part.files}
    new = [i for i, n in enumerate(names) if n not in where]
    check_present([version.files[i].path for i in new], what)
    version.check(con, new)
    rows = list(version.rows)
    unknown = [i for i, n in enumerate(rows) if n is None]
    if unknown:
        try:
            stats = parquet_stats(con, [version.files[i].path for i in unknown])
        except duckdb.Error as e:
            raise CatalogError(f"{what}: cannot read its data files: {e}") from e
        for i, s in zip(unknown, stats, strict=True):
            rows[i] = s[0]
    parts = _by_key(con, base, version, names, where, rows, what)
    count = int(str(base.source.get("partitions", len(base.partitions))))
    kind, keys = ("hash", base.keys) if parts is not None else ("none", ())
    if parts is None:
        parts = balanced([f.size for f in version.files], count)
    kept = {o[0]: o for o in base.objects}
    stamps = tuple(kept.get(u) or _stamp(u) for u in names if objects.is_uri(u))
    partitions = tuple(PartitionInfo(tuple(names[i] for i in p), sum(rows[i] or 0 for i in p)) for p in parts)
    number_key = "version" if fmt == "delta" else "snapshot"
    return replace(
        base,
        columns=version.columns,
        partitions=partitions,
        kind=kind,
        keys=keys,
        source={**base.source, number_key: version.number},
        objects=stamps,
    )


def _stamp(uri: str) -> tuple[str, int, str]:
    s = objects.stamp(uri)  # a HEAD request: an object new in this version
    return s.uri, s.size, s.etag


def _by_key(
    con: duckdb.DuckDBPyConnection,
    base: TableInfo,
    version: Version,
    names: list[str],
    where: dict[str, int],
    rows: list[int | None],
    what: str,
) -> list[list[int]] | None:
    """Partitions by the hash bucket of the table's key (new files' read here, their rows counted),
    or None where the version is not so partitioned (with a warning saying why)."""
    if base.kind != "hash" or version.key != base.keys[0] or len(base.keys) != 1:
        return None
    key = base.keys[0]
    if dict(version.columns).get(key) != base.column_type(key):
        return None  # another key type: the files kept would be in another bucket
    bucket = bucket_sql(key, base.column_type(key), len(base.partitions))

    def scan(paths: list[str]) -> str:
        return read_files("parquet", paths, BY_NAME, version.columns, base.hive or ())

    parts: list[list[int]] = [[] for _ in base.partitions]
    for i, name in enumerate(names):
        if name in where:
            parts[where[name]].append(i)
            continue
        found = file_bucket(con, scan, version.files[i].path, bucket, key)
        if isinstance(found, str):
            why = f"{what} is read unpartitioned, not hash-partitioned on {key}: {found}"
            warnings.warn(why, stacklevel=2)
            return None
        b, rows[i] = found
        parts[i % len(parts) if b is None else b].append(i)
    return parts


def _version_of(info: TableInfo, handle: Any, number: object) -> Version:
    """The files of version ``number`` of the table ``handle`` (delta-rs's at that version; pyiceberg's)."""
    if info.source["format"] == "delta":
        snap = delta.files_of(handle, str(info.source["uri"]))
        hive = tuple((c, t) for c, t in snap.columns if c in snap.partition_columns)

        def check_delta(con: duckdb.DuckDBPyConnection, new: list[int]) -> None:
            if hive:
                scan = lambda paths: read_files("parquet", paths, BY_NAME, snap.columns, hive)  # noqa: E731
                what = f"Delta table {snap.uri} version {snap.version}"
                delta.check_partition_values(con, scan, snap, new, what)

        key = snap.partition_columns[0] if len(snap.partition_columns) == 1 else None
        return Version(snap.version, snap.columns, snap.files, snap.rows, key, check_delta)
    isnap = iceberg.files_of(handle, str(info.source["table"]), int(str(number)), info.name)

    def check_iceberg(con: duckdb.DuckDBPyConnection, new: list[int]) -> None:
        what = f"Iceberg table {isnap.table} snapshot {isnap.snapshot}"
        iceberg.check_field_names(con, [isnap.files[i].path for i in new], isnap, what)

    return Version(isnap.snapshot, isnap.columns, isnap.files, isnap.rows, isnap.key, check_iceberg)


def _timestamp(text: str) -> dt.datetime:
    """A TIMESTAMP AS OF value; without a zone, UTC."""
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        example = "e.g. '2024-05-01 12:00:00'"
        raise CatalogError(f"TIMESTAMP AS OF {text!r}: not a timestamp ({example})") from None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def _version_at(uri: str, info: TableInfo, when: dt.datetime) -> int:
    """The Delta version current at ``when``: the last committed at or before it."""
    ms = when.timestamp() * 1000
    try:
        commits = delta.open_log(uri).history()
    except Exception as e:
        raise CatalogError(f"cannot read the history of Delta table {uri}: {e}") from e
    found = [int(c["version"]) for c in commits if c.get("timestamp", ms + 1) <= ms]
    if not found:
        raise CatalogError(f"Delta table {uri} has no version at or before {when}")
    return max(found)


def _snapshot_at(tbl: Any, info: TableInfo, when: dt.datetime) -> int:
    snap = tbl.snapshot_as_of_timestamp(int(when.timestamp() * 1000))
    if snap is None:
        raise CatalogError(f"Iceberg table {info.source['table']} has no snapshot at or before {when}")
    return int(snap.snapshot_id)


def _iceberg_names(info: TableInfo) -> tuple[str, str, str]:
    return str(info.source["catalog"]), str(info.source["catalog_name"]), str(info.source["table"])
