"""Loading Parquet or CSV files as a table, as they are or repartitioned by hash or range of key columns.

``load_table`` runs SPMD: every rank of the job calls it with the same arguments. Each rank reads only
its share of the input files (registering: file ``i`` on rank ``i % size``; repartitioning: shares of
about equal bytes, ingest/shares.py), so loading scales with the ranks.

Requirements:

* The data directory is on storage shared by all ranks: every rank writes its part files there and
  rank 0 moves them into place and records them in the catalog.
* Input files outside the data directory are recorded by absolute path (files inside it by relative
  path), so when registered as they are they must stay readable by every rank at the same path.
* Objects (``s3://bucket/...``, storage/objects.py) are recorded by URI, with the size and ETag
  each had, so a rank refuses one replaced since; globs are expanded by listing the bucket, and
  the objects are ordered by size (largest first) so that partitions dealt round-robin to the ranks
  give each about the same bytes.

Repartitioning: each rank reads its share of the inputs (about equal bytes), the rows go through the
exchange to the rank owning their partition (ingest/shuffle.py), and that rank writes the partition as
Parquet to ``DIR/<table>/part-<p>-r<rank>.parquet``. Files are first written to a staging directory
``DIR/<table>/.load-<id>/`` and only moved into place once every rank has succeeded, so a failed load
leaves the previous table intact, and no directory it created. With ``output`` (an ``s3://`` prefix)
they are uploaded there instead, and the catalog entry saved last is the commit point
(ingest/object_output.py).

``repartition_table`` rewrites a stored hash table the same way, from its own files: for a table placed
by a DuckDB whose ``hash()`` differs from this one's (see ``catalog.placement``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import duckdb

from duckflock.catalog import Catalog, PartitionInfo, TableInfo
from duckflock.catalog.partitioning import canonical_hash_type
from duckflock.catalog.placement import hash_sql, range_partition_sql, range_splitters
from duckflock.errors import CatalogError
from duckflock.exec.resources.runtime import Runtime
from duckflock.ingest import leases
from duckflock.ingest.leases import Lease
from duckflock.ingest.object_output import OWNED, ObjectOutput, owned_objects, prefix_of, remove
from duckflock.ingest.shares import share
from duckflock.ingest.shuffle import shuffle_partitions
from duckflock.ingest.widths import with_widths
from duckflock.plan.sql_text import copy_schema_probe, files_sql, read_files
from duckflock.sqltext import quote_ident
from duckflock.storage import objects
from duckflock.storage.objects import is_uri

DEFAULT_PARTITIONS = 12
_PART_COLUMN = "__duckflock_part"
_PART_FILE = re.compile(r"part-\d+-r\d+(-\d+)?\.parquet")
STAGING_PREFIX = ".load-"
_GLOB_CHARS = re.compile(r"[*?\[]")  # what makes DuckDB treat a path as a glob pattern
_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
_CSV_SUFFIXES = tuple(s + c for s in (".csv", ".tsv", ".txt") for c in ("", ".gz", ".zst"))

FileStats = tuple[int, object, object]  # rows, min, max (None without a key or without rows)
Columns = tuple[tuple[str, str], ...]
Source = Path | str  # an input file: a local path or an object URI


# ---- reading inputs ----------------------------------------------------------------------------


def describe(con: duckdb.DuckDBPyConnection, source_sql: str) -> Columns:
    return tuple((r[0], r[1]) for r in con.execute(f"DESCRIBE SELECT * FROM {source_sql}").fetchall())


def parquet_stats(
    con: duckdb.DuckDBPyConnection, paths: list[str], key: str | None = None, key_type: str | None = None
) -> list[FileStats]:
    """(rows, min key, max key) of each Parquet file.

    Read from the file footers where they hold exact statistics for every row group, so even huge
    files cost one footer read; otherwise the key column is scanned.
    """
    if not paths:
        return []
    files = files_sql(paths)
    rows = dict(con.execute(f"SELECT file_name, num_rows FROM parquet_file_metadata({files})").fetchall())
    if key is None:
        return [(int(rows[p]), None, None) for p in paths]
    t = key_type or "VARCHAR"
    lo = f"TRY_CAST(coalesce(stats_min_value, stats_min) AS {t})"
    hi = f"TRY_CAST(coalesce(stats_max_value, stats_max) AS {t})"
    usable = (
        f"(stats_null_count = num_values OR ({lo} IS NOT NULL AND {hi} IS NOT NULL"
        " AND coalesce(min_is_exact, true) AND coalesce(max_is_exact, true)))"
    )
    meta = {
        r[0]: r[1:]
        for r in con.execute(
            f"SELECT file_name, min({lo}), max({hi}), bool_and(coalesce({usable}, false)) "
            f"FROM parquet_metadata({files}) WHERE path_in_schema = ? GROUP BY file_name",
            [key],
        ).fetchall()
    }
    out: list[FileStats] = []
    for p in paths:
        n = int(rows[p])
        if n == 0:
            out.append((0, None, None))
        elif p in meta and meta[p][2]:
            out.append((n, meta[p][0], meta[p][1]))
        else:
            k = quote_ident(key)
            mn, mx = con.execute(f"SELECT min({k}), max({k}) FROM read_parquet({files_sql([p])})").fetchall()[
                0
            ]
            out.append((n, mn, mx))
    return out


# ---- inputs -------------------------------------------------------------------------------------


def expand_files(con: duckdb.DuckDBPyConnection, patterns: list[str]) -> list[Path]:
    """Absolute paths of the input files, in the order and number DuckDB's readers take them from
    these names: globs are expanded by DuckDB's own ``glob()`` (which, unlike Python's, matches
    hidden files), and a file named twice is read twice. Raises CatalogError naming the file."""
    out: list[Path] = []
    for pattern in patterns:
        pattern = os.path.expanduser(str(pattern))
        if _GLOB_CHARS.search(pattern):
            try:
                matches = [r[0] for r in con.execute("SELECT file FROM glob(?)", [pattern]).fetchall()]
            except duckdb.Error as e:
                raise CatalogError(f"cannot expand {pattern!r}: {e}") from e
            if not matches:
                raise CatalogError(f"no input file matches {pattern!r}")
        else:
            if not os.path.exists(pattern):
                raise CatalogError(f"input file {pattern} does not exist")
            if os.path.isdir(pattern):
                raise CatalogError(
                    f"input {pattern} is a directory; give its files, e.g. {pattern}/*.parquet"
                )
            matches = [pattern]
        for m in matches:
            if not os.access(m, os.R_OK):
                raise CatalogError(f"input file {m} is not readable")
            out.append(Path(m).resolve())
    if not out:
        raise CatalogError("no input files given")
    return out


def detect_format(paths: Sequence[Source], fmt: str | None) -> str:
    if fmt is not None:
        if fmt.lower() not in ("parquet", "csv"):
            raise CatalogError(f"unknown input format {fmt!r} (use 'parquet' or 'csv')")
        return fmt.lower()
    found: set[str] = set()
    for p in paths:
        name = os.path.basename(str(p)).lower()
        if name.endswith(_PARQUET_SUFFIXES):
            found.add("parquet")
        elif name.endswith(_CSV_SUFFIXES):
            found.add("csv")
        else:
            raise CatalogError(f"cannot tell the format of {p} from its name; give the format explicitly")
    if len(found) > 1:
        raise CatalogError("input files mix Parquet and CSV; load them as separate tables")
    return found.pop()


@dataclass(frozen=True)
class Input:
    """How to read the input files: format, CSV dialect and the schema every rank agrees on."""

    fmt: str
    csv_options: dict[str, object]
    columns: Columns
    hive: Columns | None = ()  # hive partition columns of the input paths (see TableInfo.hive)

    def scan(self, paths: Iterable[str | os.PathLike[str]]) -> str:
        columns = self.columns if self.fmt == "csv" else None
        return read_files(self.fmt, paths, self.csv_options, columns, self.hive)


def _hive_schema(
    con: duckdb.DuckDBPyConnection, fmt: str, paths: Sequence[Source]
) -> tuple[Columns, Columns]:
    """The columns DuckDB reads from all ``paths``, and of those the hive partition columns it adds
    (with the types it gives them over all paths): a rank reading a few of the files is told them."""
    columns = describe(con, read_files(fmt, paths, hive=None))
    plain = {n for n, _ in describe(con, read_files(fmt, paths, hive=()))}
    return columns, tuple(c for c in columns if c[0] not in plain)


def _check_readable(con: duckdb.DuckDBPyConnection, source: Input, path: Source) -> None:
    """A Parquet file must open and have the first file's schema. A CSV file, read alone as DuckDB
    reads it, must have the columns DuckDB found in all the files (it matches them by name)."""
    columns = source.columns if source.fmt == "parquet" else None
    try:
        got = describe(con, read_files(source.fmt, [path], source.csv_options, columns, source.hive))
    except duckdb.Error as e:
        raise CatalogError(f"cannot read input file {path}: {e}") from e
    if source.fmt == "csv":
        names, expect = [n for n, _ in got], [n for n, _ in source.columns]
        if sorted(names) != sorted(expect):
            raise CatalogError(
                f"input file {path} has the columns {names}, but DuckDB reads the other input files "
                f"with {expect}: load them as separate tables"
            )
    elif got != source.columns:
        raise CatalogError(
            f"input file {path} has columns {list(got)}, but the first file has {list(source.columns)}"
        )


def _rel(root: Path, path: Source) -> str:
    if isinstance(path, str):  # an object URI, as it is
        return path
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


# ---- partitioning -------------------------------------------------------------------------------


def _plan(
    columns: Columns, partition_by: list[str] | None, partitions: int | None, scheme: str | None
) -> tuple[tuple[str, ...], str, int]:
    """(key columns, scheme, partition count) after validating the arguments."""
    if not partition_by:
        if scheme is not None or partitions is not None:
            raise CatalogError("a partitioning scheme or count needs partition_by columns")
        return (), "none", 0
    scheme = scheme or "hash"
    if scheme not in ("hash", "range"):
        raise CatalogError(f"unknown partitioning scheme {scheme!r} (use 'hash' or 'range')")
    by_lower = {name.lower(): name for name, _ in columns}
    keys: list[str] = []
    for k in partition_by:
        name = by_lower.get(k.lower())
        if name is None:
            raise CatalogError(
                f"no column {k!r} to partition by (columns: {', '.join(n for n, _ in columns)})"
            )
        if name in keys:
            raise CatalogError(f"column {k!r} is given twice in partition_by")
        keys.append(name)
    if scheme == "range" and len(keys) != 1:
        raise CatalogError("range partitioning takes exactly one key column")
    key_type = dict(columns)[keys[0]].upper()
    if scheme == "range" and key_type in ("TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ"):
        # Its bounds, kept as Python values, would need the pytz package, which DuckDB leaves out.
        raise CatalogError(f"range partitioning on {key_type} keys is not supported: hash-partition it")
    count = DEFAULT_PARTITIONS if partitions is None else partitions
    if count < 1:
        raise CatalogError(f"the number of partitions must be at least 1, not {count}")
    return tuple(keys), scheme, count


def _output_columns(con: duckdb.DuckDBPyConnection, source: str, staging: Path, rank: int) -> Columns:
    """The schema as written to Parquet, which may differ from the input (HUGEINT becomes DOUBLE).

    Hash partitions must be computed on the types readers will see, so every rank probes the same
    input file by writing zero rows of it.
    """
    probe = staging / f"schema-r{rank}.parquet"
    try:
        con.execute(copy_schema_probe(source, str(probe)))
        return describe(con, read_files("parquet", [probe]))  # without hive columns of DIR's path
    finally:
        probe.unlink(missing_ok=True)


# ---- the SPMD entry point -----------------------------------------------------------------------


def load_table(
    rt: Runtime,
    qid: int,
    catalog_dir: str | os.PathLike[str],
    name: str,
    files: list[str],
    partition_by: list[str] | None = None,
    partitions: int | None = None,
    scheme: str | None = None,
    fmt: str | None = None,
    hive_key: str | None = None,
    output: str | None = None,
) -> TableInfo | None:
    """Load ``files`` as table ``name`` of the data directory ``catalog_dir``; call on every rank.

    Without ``partition_by`` the files are registered as they are (one partition each). With it they
    are rewritten as Parquet, split by ``scheme`` ("hash", the default, or "range" on one column) into
    ``partitions`` partitions (default 12), under the data directory or, with ``output``
    (``s3://bucket/prefix/``), as objects there. With ``hive_key`` instead they are registered as
    they are, hash-partitioned on that hive column of their paths (ingest/hive.py). Returns the new
    TableInfo on rank 0 and None elsewhere;
    rank 0 saves the catalog. Errors are raised as exceptions; the caller reports them to the other
    ranks (``rt.mux.fail``), which are then released from their waits.
    """
    args = (partition_by, partitions, scheme, fmt, hive_key, output)
    with _root_cause(rt, qid), _running(rt, qid):
        return _load(rt, qid, catalog_dir, name, files, *args)


def stale_hash_tables(catalog: Catalog) -> list[str]:
    """Hash tables whose rows were placed by a hash() other than this DuckDB's."""
    return sorted(n for n, t in catalog.tables.items() if t.kind == "hash" and not t.hash_is_current())


def repartition_table(
    rt: Runtime, qid: int, catalog_dir: str | os.PathLike[str], name: str
) -> TableInfo | None:
    """Rewrite the stored hash table ``name`` with this DuckDB's hash: same keys, same partition count,
    its rows read from its own files; call on every rank. Returns the new TableInfo on rank 0 (which
    saves the catalog, now with this DuckDB's canary) and None elsewhere."""
    with _root_cause(rt, qid), _running(rt, qid):
        return _repartition_stored(rt, qid, Path(catalog_dir).resolve(), name)


@contextlib.contextmanager
def _running(rt: Runtime, qid: int) -> Iterator[None]:
    """The load runs as query ``qid`` on this rank: another rank's failure interrupts its DuckDB."""
    rt.begin_query(qid)
    try:
        yield
    finally:
        rt.end_query()


@contextlib.contextmanager
def _root_cause(rt: Runtime, qid: int) -> Iterator[None]:
    """Another rank's failure interrupts this rank's DuckDB query: report that root cause instead."""
    try:
        yield
    except Exception as e:
        told = rt.mux.told_error(qid)
        if told is not None and _interrupted(e):
            raise told from e
        raise


def _interrupted(e: BaseException | None) -> bool:
    while e is not None:
        if isinstance(e, duckdb.InterruptException):
            return True
        e = e.__cause__
    return False


def table_name(name: str) -> str:
    """The catalog's name of a table to load: SQL's, in lower case."""
    if not _TABLE_NAME.fullmatch(name):
        raise CatalogError(f"invalid table name {name!r} (letters, digits and underscores)")
    return name.lower()


def _load(
    rt: Runtime,
    qid: int,
    catalog_dir: str | os.PathLike[str],
    name: str,
    files: list[str],
    partition_by: list[str] | None,
    partitions: int | None,
    scheme: str | None,
    fmt: str | None,
    hive_key: str | None = None,
    output: str | None = None,
) -> TableInfo | None:
    table = table_name(name)
    root = Path(catalog_dir).resolve()
    con = rt.con
    if output is not None and not partition_by:
        raise CatalogError("an output prefix is where repartitioned files go: it needs partition_by columns")
    prefix = prefix_of(output) if output is not None else None
    # Every rank checks all names (cheap), so a missing file fails every rank alike, without messages.
    sized = _expand_objects(files) if any(map(is_uri, files)) else _sized(expand_files(con, files))
    paths: Sequence[Source] = [p for p, _ in sized]
    fmt = detect_format(paths, fmt)
    try:
        source = Input(fmt, {}, *_hive_schema(con, fmt, paths))
    except duckdb.Error as e:
        what = f"input file {paths[0]}" if len(paths) == 1 else "the input files together"
        raise CatalogError(f"cannot read {what}: {e}") from e
    if hive_key is not None and (partition_by or scheme):
        raise CatalogError("a hive partitioning key registers files in place: give no partition_by or scheme")
    # With a hive key, the partition count is the hive placement's (checked there).
    keys, scheme, count = _plan(source.columns, partition_by, None if hive_key else partitions, scheme)
    mine = list(range(rt.rank, len(paths), rt.size))
    for i in mine:
        _check_readable(con, source, paths[i])
    if hive_key is not None:
        from duckflock.ingest.hive import register_hive  # it imports this module

        return register_hive(rt, qid, root, table, source, [str(p) for p in paths], hive_key, partitions)

    if not keys:
        return _register(rt, qid, root, table, source, paths, mine)
    local = {p for p in paths if isinstance(p, Path)}
    sizes = [n for _, n in sized]
    return _staged(rt, qid, root, table, source, paths, sizes, keys, scheme, count, local, prefix)


def _expand_objects(patterns: list[str]) -> list[tuple[Source, int]]:
    """The objects of ``s3://`` names and globs with their sizes, largest first (see the module's
    docstring)."""
    if not all(map(is_uri, patterns)):
        raise CatalogError("inputs mix objects (s3://...) and local files: load them as separate tables")
    listed: list[tuple[Source, int]] = list(objects.expand(patterns))
    return sorted(listed, key=lambda e: -e[1])


def _sized(paths: list[Path]) -> list[tuple[Source, int]]:
    return [(p, p.stat().st_size) for p in paths]


def _repartition_stored(rt: Runtime, qid: int, root: Path, name: str) -> TableInfo | None:
    info = Catalog.load(root).table(name)
    if info.kind != "hash":
        raise CatalogError(f"table {info.name!r} is not hash-partitioned: there is nothing to repartition")
    old: list[Source] = [f if is_uri(f) else (root / f).resolve() for p in info.partitions for f in p.files]
    if not old:  # no rows: every placement is right, only the canary is stale
        emptied = replace(info, hash_canary=None).stamped()
        return _publish(rt, root, emptied, [], set()) if rt.rank == 0 else None
    source = Input(info.format, info.csv_options, info.columns, info.hive)
    objects.begin_query()
    objects.expect(objects.Stamp(u, n, e) for u, n, e in info.objects)  # a table replaced meanwhile
    known = {u: n for u, n, _ in info.objects}
    sizes = [known[f] if isinstance(f, str) and f in known else _size(f) for f in old]
    prefix = str(info.source[OWNED]) if info.source.get(OWNED) else None  # written there again
    how = (info.keys, "hash", len(info.partitions), set[Path](), prefix)
    new = _staged(rt, qid, root, info.name, source, old, sizes, *how)
    if new is not None:  # rank 0, after the catalog names only the new files: the old local ones go
        current = {(root / f).resolve() for p in new.partitions for f in p.files if not is_uri(f)}
        for f in old:
            if isinstance(f, Path) and f not in current:
                f.unlink(missing_ok=True)
    return new


def _size(path: Source) -> int:
    return objects.stamp(path).size if isinstance(path, str) else path.stat().st_size


def _staged(
    rt: Runtime,
    qid: int,
    root: Path,
    table: str,
    source: Input,
    paths: Sequence[Source],
    sizes: list[int],
    keys: tuple[str, ...],
    scheme: str,
    count: int,
    keep: set[Path],
    prefix: str | None,
) -> TableInfo | None:
    """Repartition ``paths`` (of ``sizes`` bytes) into ``table`` through a staging directory, which
    a failure cleans up, and into objects under ``prefix`` when given (removed on failure).
    ``keep``: files of the table's directory that stay even when the new table does not list them."""
    mine = share(sizes, rt.rank, rt.size)
    # Checked before the allgather, so before any rank creates them: every rank sees the same.
    created = [d for d in (root / table, root) if not d.exists()]
    load_id = uuid.uuid4().hex
    output = ObjectOutput(prefix, load_id[:12]) if prefix is not None else None
    # Rank 0's lease says what this load writes until it ends (``duckflock vacuum`` leaves it be).
    lease = Lease.mine(load_id, table, prefix) if rt.rank == 0 else None
    if lease is not None:
        leases.take(root, lease)
    if output is not None and lease is not None:
        try:
            output.check_writable(lease)  # before any rank reads: the others wait in the allgather
        except BaseException:
            _release(root, lease, None)
            raise
    # Named by rank 0 for all ranks, so that loads running at the same time never share one.
    load_id = rt.mux.allgather(qid, load_id)[0]
    if output is not None:
        output.load = load_id[:12]
    staging = root / table / f"{STAGING_PREFIX}{load_id}"
    staging.mkdir(parents=True, exist_ok=True)
    try:
        how = (keys, scheme, count, keep, staging, output)
        done = _repartition(rt, qid, root, table, source, paths, mine, *how)
    except BaseException:
        if output is not None:
            output.discard()
        if lease is not None:
            _release(root, lease, output)
        # Remove what this rank staged; the previous version of the table stays as it was.
        own = re.compile(rf"part-\d+-r{rt.rank}(-\d+)?\.parquet")
        for f in staging.iterdir():
            if own.fullmatch(f.name):
                f.unlink(missing_ok=True)
        shutil.rmtree(staging / f"r{rt.rank}", ignore_errors=True)
        # The last rank out removes the emptied directory, and those this load created.
        with contextlib.suppress(OSError):
            for d in (staging, *created):
                d.rmdir()
        raise
    if lease is not None:
        _release(root, lease, output)
    return done


def _release(root: Path, lease: Lease, output: ObjectOutput | None) -> None:
    if output is not None:
        output.release(lease)
    leases.release(root, lease)


def _register(
    rt: Runtime,
    qid: int,
    root: Path,
    table: str,
    source: Input,
    paths: Sequence[Source],
    mine: list[int],
) -> TableInfo | None:
    """Record the files as they are: each file one partition, no known partitioning."""
    counts: list[tuple[int, int]] = []
    if source.fmt == "parquet":
        stats = parquet_stats(rt.con, [str(paths[i]) for i in mine])
        counts = [(i, s[0]) for i, s in zip(mine, stats, strict=True)]
    else:
        for i in mine:
            try:
                n = rt.con.execute(f"SELECT count(*) FROM {source.scan([paths[i]])}").fetchall()[0]
            except duckdb.Error as e:
                raise CatalogError(f"cannot read input file {paths[i]}: {e}") from e
            counts.append((i, int(n[0])))
    # Each rank stamps its share of the objects (a HEAD each: listings carry no ETag).
    stamps = [objects.stamp(p) for i in mine if isinstance(p := paths[i], str)]
    gathered = rt.mux.allgather(qid, (counts, stamps))
    if rt.rank != 0:
        return None
    rows = dict(pair for part, _ in gathered for pair in part)
    info = TableInfo(
        name=table,
        format=source.fmt,
        columns=source.columns,
        partitions=tuple(PartitionInfo((_rel(root, p),), rows[i]) for i, p in enumerate(paths)),
        csv_options=source.csv_options,
        hive=source.hive,
        objects=tuple((s.uri, s.size, s.etag) for _, part in gathered for s in part),
    )
    return _publish(rt, root, info, [], {p for p in paths if isinstance(p, Path)})


def _repartition(
    rt: Runtime,
    qid: int,
    root: Path,
    table: str,
    source: Input,
    paths: Sequence[Source],
    mine: list[int],
    keys: tuple[str, ...],
    scheme: str,
    count: int,
    keep: set[Path],
    staging: Path,
    output: ObjectOutput | None,
) -> TableInfo | None:
    scan = source.scan([paths[i] for i in mine]) if mine else None
    out_columns = _output_columns(rt.con, source.scan([paths[0]]), staging, rt.rank)
    types = dict(out_columns)
    if scheme == "range":
        key = keys[0]
        gather = functools.partial(rt.mux.allgather, qid)
        splitters = range_splitters(rt.con, gather, scan, key, types[key], count)
        part_sql = range_partition_sql(key, types[key], splitters)
    else:
        try:
            hash_types = tuple(canonical_hash_type(types[k]) for k in keys)
        except ValueError as e:
            raise CatalogError(f"cannot hash-partition {table}: {e}") from None
        part_sql = hash_sql([quote_ident(k) for k in keys], hash_types, count)

    # A rank without inputs sends no rows, but its end of the exchange (with the schema).
    rows = scan if scan is not None else f"(SELECT * FROM {source.scan([paths[0]])} LIMIT 0)"
    names = ", ".join(str(paths[i]) for i in mine) or "no input"  # the failure names the rank
    written = shuffle_partitions(rt, qid, rows, part_sql, _PART_COLUMN, staging, out_columns, names)
    range_key = keys[0] if scheme == "range" else None
    mine_written = _report(rt, table, written, range_key, types[keys[0]], output)
    gathered = rt.mux.allgather(qid, mine_written)
    if rt.rank != 0:
        return None
    parts: list[list[tuple[str, int, object, object]]] = [[] for _ in range(count)]
    for rank_report, _ in gathered:
        for p, name, n, mn, mx in rank_report:
            parts[p].append((name, n, mn, mx))
    infos = [_merge(part) for part in parts]
    kind = scheme
    if scheme == "range" and any(p.rows and p.min is None for p in infos):
        kind = "none"  # a partition of only NULL keys has no interval; do not claim range bounds
    info = TableInfo(table, "parquet", out_columns, tuple(infos), kind, keys, hive=()).stamped()
    if output is not None:
        stamped = tuple((s.uri, s.size, s.etag) for _, rank_stamps in gathered for s in rank_stamps)
        info = replace(info, source={OWNED: output.prefix}, objects=stamped)
        try:
            return _publish(rt, root, info, [], keep, staging)
        except BaseException:
            remove(u for u, _, _ in stamped)  # every rank's: theirs have returned
            raise
    moves = [(staging / Path(name).name, root / name) for part in parts for name, *_ in part]
    return _publish(rt, root, info, moves, keep, staging)


_Report = tuple[list[tuple[int, str, int, object, object]], list[objects.Stamp]]


def _report(
    rt: Runtime,
    table: str,
    written: dict[int, list[Path]],
    range_key: str | None,
    key_type: str,
    output: ObjectOutput | None,
) -> _Report:
    """(partition, catalog name, rows, min, max) of each file this rank wrote, uploaded first with
    an ``output`` (the name is then the object's URI), and the stamps of the objects."""
    report: list[tuple[int, str, int, object, object]] = []
    stamps: list[objects.Stamp] = []
    for p, fs in sorted(written.items()):
        stats = parquet_stats(rt.con, [str(f) for f in fs], range_key, key_type)
        for f, (n, mn, mx) in zip(fs, stats, strict=True):
            name = f"{table}/{f.name}"
            if output is not None:
                stamps.append(output.put(f))
                name = stamps[-1].uri
            report.append((p, name, n, mn, mx))
    return report, stamps


def _merge(files: list[tuple[str, int, Any, Any]]) -> PartitionInfo:
    """One partition from the files its rank wrote for it (min/max over the non-empty ones)."""
    mins = [mn for _, _, mn, _ in files if mn is not None]
    maxs = [mx for _, _, _, mx in files if mx is not None]
    return PartitionInfo(
        files=tuple(f for f, *_ in files),
        rows=sum(n for _, n, _, _ in files),
        min=min(mins) if mins else None,
        max=max(maxs) if maxs else None,
    )


def _publish(
    rt: Runtime,
    root: Path,
    info: TableInfo,
    moves: list[tuple[Path, Path]],
    inputs: set[Path],
    staging: Path | None = None,
) -> TableInfo:
    """On rank 0 after every rank succeeded: move staged files in, drop the old table's files, save
    (with its string widths measured); what was saved. ``inputs``: files to keep although the table
    does not list them (the load's own input files). Under the catalog's lock, so that loads into
    one directory at the same time each keep their table."""
    with Catalog.updating(root) as catalog:
        replaced = set(owned_objects(catalog.find(info.name))) - set(info.object_uris())
        tdir = root / info.name
        for src, dst in moves:
            os.replace(src, dst)
        keep = {(root / f).resolve() for p in info.partitions for f in p.files} | inputs
        if tdir.is_dir():
            for f in tdir.iterdir():
                if _PART_FILE.fullmatch(f.name) and f.resolve() not in keep:
                    f.unlink(missing_ok=True)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            tdir.rmdir()  # a table now written as objects keeps no directory (only an empty one goes)
        info = with_widths(rt.con, info, root)
        catalog.put(info)
    remove(sorted(replaced))  # objects the table wrote before: no longer named once saved
    if rt.catalog is not None and rt.catalog.root == root:
        rt.catalog.put(info)
    return info
