"""Tables registered in place whose layout says where their rows are: hive ``key=value`` directories,
Delta Lake and Iceberg tables. Shared here: the hash bucket each file's rows fall in, files grouped
into partitions, and the table recorded in the catalog. No file is rewritten.

A file counts as placed by hash only where DuckDB itself, reading the file as the ranks will, finds
all its rows in one bucket of ``hash_sql`` (the partition function of tables duckflock writes, NULL
keys included): so a table recorded as hash-partitioned is exactly that, whatever its metadata claims,
and joins a duckflock hash table of the same key type and partition count co-located.
"""

from __future__ import annotations

import os
import urllib.parse
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from duckflock.catalog import PartitionInfo, TableInfo
from duckflock.catalog.partitioning import canonical_hash_type
from duckflock.catalog.placement import hash_sql
from duckflock.errors import CatalogError
from duckflock.exec.resources.runtime import Runtime
from duckflock.ingest.load import Input, _publish, _rel, parquet_stats
from duckflock.ingest.shares import balanced
from duckflock.sqltext import quote_ident
from duckflock.storage import objects

# The files of a table whose columns may differ from file to file (its schema evolved): read by name.
BY_NAME: dict[str, object] = {"union_by_name": True}


@dataclass(frozen=True)
class DataFile:
    path: str  # as DuckDB reads it: a local path or a URI (s3://...)
    size: int  # bytes, to balance partitions


@dataclass(frozen=True)
class Placement:
    """Files grouped into partitions: by hash bucket of ``key`` (``key`` set) or by bytes."""

    parts: list[list[int]]  # file indexes per partition
    rows: list[int]  # per file
    key: str | None = None


def local_path(uri: str) -> str:
    """A ``file://`` URI as the local path DuckDB reads; other URIs (s3://...) and paths as they are."""
    if uri.startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlparse(uri).path)
    return uri


def stored_path(root: Path, path: str) -> str:
    """How the catalog names a file: relative to the data directory inside it, else absolute; URIs
    as they are."""
    return path if "://" in path else _rel(root, Path(path).resolve())


def data_files(rt: Runtime, qid: int, paths: list[str]) -> tuple[list[DataFile], list[objects.Stamp]]:
    """The files with their sizes, and the stamps of those that are objects."""
    stamps = object_stamps(rt, qid, paths)
    size = {s.uri: s.size for s in stamps}
    return [DataFile(p, size[p] if p in size else os.path.getsize(p)) for p in paths], stamps


def object_stamps(rt: Runtime, qid: int, paths: list[str]) -> list[objects.Stamp]:
    """The stamps of the paths that are objects (each rank HEADs its share; listings and lake
    metadata carry no ETag): recorded, an object replaced later is refused when read."""
    if not any(map(objects.is_uri, paths)):  # the same on every rank: all gather or none
        return []
    mine = [objects.stamp(paths[i]) for i in range(rt.rank, len(paths), rt.size) if objects.is_uri(paths[i])]
    return [s for part in rt.mux.allgather(qid, mine) for s in part]


def delta_storage_options() -> dict[str, str]:
    """delta-rs's options for s3:// tables, from the settings storage/objects.py reads (delta-rs
    takes the credentials from the same AWS_* variables itself)."""
    settings = objects.Settings.from_env()
    out = {"AWS_REGION": settings.region or "us-east-1", "timeout": f"{settings.timeout_s}s"}
    out["connect_timeout"] = f"{settings.timeout_s}s"
    if settings.endpoint:
        out["AWS_ENDPOINT_URL"] = settings.endpoint
        out["AWS_ALLOW_HTTP"] = str(settings.endpoint.startswith("http://")).lower()
    if settings.anonymous:
        out["AWS_SKIP_SIGNATURE"] = "true"
    return out


def iceberg_properties() -> dict[str, Any]:
    """pyiceberg's FileIO properties for a warehouse on S3, from storage/objects.py's settings
    (credentials: the AWS SDK's chain, as for tables on S3)."""
    settings = objects.Settings.from_env()
    out: dict[str, Any] = {
        "s3.region": settings.region or "us-east-1",
        "s3.connect-timeout": settings.timeout_s,
        "s3.request-timeout": settings.timeout_s,
    }
    if settings.endpoint:
        out["s3.endpoint"] = settings.endpoint
    if settings.anonymous:
        out["s3.anonymous"] = "true"
    return out


def check_present(paths: list[str], what: str) -> None:
    """A local data file that is gone fails the load naming it (a URI fails when DuckDB reads it)."""
    for p in paths:
        if "://" not in p and not os.path.isfile(p):
            raise CatalogError(f"{what}: data file {p} does not exist (removed, e.g. by a vacuum, or moved)")


def file_buckets(
    rt: Runtime,
    qid: int,
    scan: Callable[[list[str]], str],
    paths: list[str],
    key: str,
    key_type: str,
    count: int,
) -> tuple[list[int | None], list[int]] | str:
    """Per file the one bucket of ``hash_sql`` its rows' ``key`` gives (None for a file without rows)
    and its rows; or why the files are not placed so (the same answer on every rank). Every rank
    reads its share of the files (file ``i`` on rank ``i % size``)."""
    try:
        bucket = bucket_sql(key, key_type, count)
    except ValueError as e:
        return str(e)
    mine: list[tuple[int, int | None, int]] = []
    reason = None
    for i in range(rt.rank, len(paths), rt.size):
        found = file_bucket(rt.con, scan, paths[i], bucket, key)
        if isinstance(found, str):
            reason = found
            break
        mine.append((i, *found))
    gathered = rt.mux.allgather(qid, (mine, reason))
    reasons = [r for _, r in gathered if r is not None]
    if reasons:
        return reasons[0]
    buckets: list[int | None] = [None] * len(paths)
    rows_of = [0] * len(paths)
    for part, _ in gathered:
        for i, b, n in part:
            buckets[i], rows_of[i] = b, n
    return buckets, rows_of


def bucket_sql(key: str, key_type: str, count: int) -> str:
    """The partition ``hash_sql`` puts a row of ``key`` in (ValueError: a type it does not hash)."""
    return hash_sql([quote_ident(key)], (canonical_hash_type(key_type),), count)


def file_bucket(
    con: duckdb.DuckDBPyConnection, scan: Callable[[list[str]], str], path: str, bucket: str, key: str
) -> tuple[int | None, int] | str:
    """The one bucket of the file's rows (None without rows) and its rows, or why it has none."""
    query = f"SELECT count(DISTINCT b), min(b), count(*) FROM (SELECT {bucket} AS b FROM {scan([path])})"
    try:
        kinds, b, rows = con.execute(query).fetchall()[0]
    except duckdb.Error as e:
        raise CatalogError(f"cannot read data file {path}: {e}") from e
    if kinds > 1:
        return f"{path} holds rows of several values of {key}"
    return (None if rows == 0 else int(b)), int(rows)


def file_rows(rt: Runtime, qid: int, paths: list[str]) -> list[int]:
    """Rows of each Parquet file, from its footer (each rank reads its share)."""
    mine = list(range(rt.rank, len(paths), rt.size))
    try:
        stats = parquet_stats(rt.con, [paths[i] for i in mine])
    except duckdb.Error as e:
        raise CatalogError(f"cannot read the data files: {e}") from e
    rows = [0] * len(paths)
    for part in rt.mux.allgather(qid, [(i, s[0]) for i, s in zip(mine, stats, strict=True)]):
        for i, n in part:
            rows[i] = n
    return rows


def place(
    rt: Runtime,
    qid: int,
    scan: Callable[[list[str]], str],
    files: list[DataFile],
    key: tuple[str, str] | None,
    count: int,
    table: str,
) -> Placement:
    """Partitions of the files: by hash bucket of ``key`` (name, DuckDB type) where every file holds
    one bucket, else by bytes (with a warning on rank 0 saying why the key is not used)."""
    paths = [f.path for f in files]
    if key is not None:
        found = file_buckets(rt, qid, scan, paths, key[0], key[1], count)
        if not isinstance(found, str):
            buckets, rows = found
            parts: list[list[int]] = [[] for _ in range(count)]
            for i, b in enumerate(buckets):
                parts[i % count if b is None else b].append(i)  # a file without rows goes anywhere
            return Placement(parts, rows, key[0])
        if rt.rank == 0:
            warnings.warn(
                f"table {table!r} is registered as unpartitioned, not hash-partitioned on {key[0]}: {found}",
                stacklevel=2,
            )
    return Placement(balanced([f.size for f in files], count), file_rows(rt, qid, paths))


def register(
    rt: Runtime,
    root: Path,
    table: str,
    source: Input,
    files: list[DataFile],
    placement: Placement,
    origin: dict[str, object],
    stamps: Sequence[objects.Stamp] = (),
) -> TableInfo | None:
    """Record the files as table ``table`` (rank 0; None elsewhere): a hash table on the placement's
    key (its canary recorded as for tables duckflock partitions) or an unpartitioned one; with the
    objects' ``stamps``."""
    if rt.rank != 0:
        return None
    partitions = tuple(
        PartitionInfo(
            tuple(stored_path(root, files[i].path) for i in part), sum(placement.rows[i] for i in part)
        )
        for part in placement.parts
    )
    info = TableInfo(
        name=table,
        format=source.fmt,
        columns=source.columns,
        partitions=partitions,
        kind="hash" if placement.key else "none",
        keys=(placement.key,) if placement.key else (),
        csv_options=source.csv_options,
        hive=source.hive,
        source=origin,
        objects=tuple((s.uri, s.size, s.etag) for s in stamps),
    ).stamped()  # a hash table: this DuckDB's canary, as for tables duckflock partitions
    inputs = {Path(f.path).resolve() for f in files if "://" not in f.path}
    return _publish(rt, root, info, [], inputs)
