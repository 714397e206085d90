"""The catalog: per table its schema, files per partition, row counts and partitioning.

Stored as JSON in the data directory so that any number of ranks (and any later session) can use it.
File paths are relative to the data directory, so the directory can be moved or shared; objects
registered in place (``s3://bucket/key``, storage/objects.py) are kept as their URIs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import itertools
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from duckflock.catalog.partitioning import (
    Arbitrary,
    Hashed,
    Partitioning,
    Ranged,
    canonical_hash_type,
    partitions_of_rank,
)
from duckflock.catalog.placement import canary, trusted
from duckflock.catalog.validate import VERSION, check_catalog
from duckflock.errors import CatalogError
from duckflock.storage.objects import is_uri, prefixes

CATALOG_FILE = "duckflock_catalog.json"
LOCK_FILE = ".duckflock_catalog.lock"
_TYPE_WIDTH = {"BIGINT": 8, "INTEGER": 4, "DATE": 4, "DOUBLE": 8, "BOOLEAN": 1, "SMALLINT": 2, "TINYINT": 1}


# A lake table read at another version is a table of its own in a query's plan, named
# ``<table>@<version>`` (table names hold no '@'); users are shown ``<table> VERSION AS OF <version>``.
VERSION_MARK = "@"


def versioned_name(table: str, number: object) -> str:
    return f"{table}{VERSION_MARK}{number}"


def shown(name: str) -> str:
    """A table's name as users write it: ``t VERSION AS OF 3`` for the plan's ``t@3``."""
    table, mark, number = name.partition(VERSION_MARK)
    return f"{table} VERSION AS OF {number}" if mark else name


@dataclass(frozen=True)
class PartitionInfo:
    files: tuple[str, ...]
    rows: int
    # Min and max of the range key in this partition (None when empty or not range-partitioned).
    min: object = None
    max: object = None


@dataclass(frozen=True)
class TableInfo:
    name: str
    format: str  # "parquet" or "csv"
    columns: tuple[tuple[str, str], ...]  # (name, DuckDB type)
    partitions: tuple[PartitionInfo, ...]
    kind: str = "none"  # "hash", "range" or "none"
    keys: tuple[str, ...] = ()
    # How files are read: a CSV dialect; for Parquet of a Delta or Iceberg table {"union_by_name": True}.
    csv_options: dict[str, object] = field(default_factory=dict, compare=False)
    # Hive partition columns DuckDB adds from the paths of files registered as they are, with their
    # types (also in ``columns``); () reads the files without hive partitioning (a data directory
    # under a key=value path adds none). None: catalogs written before, DuckDB's auto-detection.
    hive: tuple[tuple[str, str], ...] | None = field(default=None, compare=False)
    # Hash tables: the canary of the DuckDB hash that placed the rows, and that DuckDB's version.
    hash_canary: int | None = field(default=None, compare=False)
    duckdb_version: str = field(default="", compare=False)
    # Measured average bytes per value of string columns (ingest/widths.py); others by their type.
    widths: tuple[tuple[str, int], ...] = field(default=(), compare=False)
    # A Delta or Iceberg table registered in place: where it is and which version of it (ingest/lake.py).
    source: dict[str, object] = field(default_factory=dict, compare=False)
    # Objects registered in place: (URI, size, ETag) of each when registered; a rank refuses to
    # read one that differs since (replaced or rewritten), naming it.
    objects: tuple[tuple[str, int, str], ...] = field(default=(), compare=False)

    def object_uris(self) -> list[str]:
        return [f for p in self.partitions for f in p.files if is_uri(f)]

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.partitions)

    def column_type(self, column: str) -> str:
        for name, typ in self.columns:
            if name == column:
                return typ
        raise CatalogError(f"table {self.name!r} has no column {column!r}")

    def row_width(self, columns: list[str] | None = None) -> int:
        """Rough bytes per row of the given columns, for broadcast-or-shuffle decisions."""
        cols = [c for c in self.columns if columns is None or c[0] in columns]
        measured = dict(self.widths)
        return sum(measured.get(c) or _type_width(t) for c, t in cols) or 1

    def scanned_bytes(self, columns: tuple[str, ...] | list[str]) -> float:
        """Rough bytes of all rows of the given columns: what a scan of them reads."""
        return self.rows * self.row_width(list(columns))

    def hash_key_types(self) -> tuple[str, ...]:
        """The keys' canonical types, as the partition hash sees them."""
        return tuple(canonical_hash_type(self.column_type(k)) for k in self.keys)

    def hash_is_current(self) -> bool:
        """Whether a hash table's rows are where this DuckDB's hash puts them (silently)."""
        return self.kind == "hash" and self.hash_canary == canary(self.hash_key_types())

    def partitioning(self) -> Partitioning:
        if self.kind == "hash":
            types = self.hash_key_types()
            if not trusted(self.name, types, self.hash_canary, self.duckdb_version):
                return Arbitrary()
            return Hashed(self.keys, types, len(self.partitions))
        if self.kind == "range":
            key = self.keys[0]
            bounds = tuple(None if p.rows == 0 else (p.min, p.max) for p in self.partitions)
            if not _disjoint(bounds):  # a key in two partitions: equal keys would not meet
                return Arbitrary()
            if not _bounds_comparable(self.column_type(key)) or not _bounds_exact(
                self.column_type(key), bounds
            ):
                return Arbitrary()
            return Ranged(key, self.column_type(key), bounds)
        return Arbitrary()

    def stamped(self) -> TableInfo:
        """A hash table partitioned just now, by this DuckDB: with this DuckDB's hash canary."""
        if self.kind != "hash" or self.hash_canary is not None:
            return self
        import duckdb  # here, not at the top: the launcher reads catalogs without loading DuckDB

        return replace(self, hash_canary=canary(self.hash_key_types()), duckdb_version=duckdb.__version__)

    def partitions_of_rank(self, rank: int, size: int) -> list[int]:
        return partitions_of_rank(len(self.partitions), rank, size)

    def to_json(self) -> dict[str, object]:
        return {
            "format": self.format,
            "columns": [list(c) for c in self.columns],
            "partitioning": {
                "kind": self.kind,
                "keys": list(self.keys),
                **(
                    {"hash_canary": self.hash_canary, "duckdb": self.duckdb_version}
                    if self.kind == "hash"
                    else {}
                ),
            },
            "csv_options": self.csv_options,
            **({"hive": dict(self.hive)} if self.hive is not None else {}),
            **({"widths": dict(self.widths)} if self.widths else {}),
            **({"source": self.source} if self.source else {}),
            **({"objects": {u: [n, e] for u, n, e in self.objects}} if self.objects else {}),
            "partitions": [
                {"files": list(p.files), "rows": p.rows, "min": _enc(p.min), "max": _enc(p.max)}
                for p in self.partitions
            ],
        }

    @classmethod
    def from_json(cls, name: str, data: dict) -> TableInfo:
        part = data.get("partitioning", {})
        return cls(
            name=name,
            format=data["format"],
            columns=tuple((c[0], c[1]) for c in data["columns"]),
            partitions=tuple(
                PartitionInfo(tuple(p["files"]), int(p["rows"]), _dec(p.get("min")), _dec(p.get("max")))
                for p in data["partitions"]
            ),
            kind=part.get("kind", "none"),
            keys=tuple(part.get("keys", ())),
            csv_options=data.get("csv_options", {}),
            hive=tuple(data["hive"].items()) if "hive" in data else None,
            hash_canary=part.get("hash_canary"),
            duckdb_version=part.get("duckdb", ""),
            widths=tuple((c, int(w)) for c, w in data.get("widths", {}).items()),
            source=data.get("source", {}),
            objects=tuple((u, int(v[0]), str(v[1])) for u, v in data.get("objects", {}).items()),
        )


def file_path(root: Path, name: str) -> str:
    """A catalog file name as DuckDB reads it: relative to ``root``, or an object URI as it is."""
    return name if is_uri(name) else str(root / name)


def _type_width(typ: str) -> int:
    return _TYPE_WIDTH.get(typ, 16 if typ.startswith("DECIMAL") else 24)


def _disjoint(bounds: tuple[tuple[Any, Any] | None, ...]) -> bool:
    """Whether no key lies in two of these closed ranges (False where bounds do not compare)."""
    ranges = [b for b in bounds if b is not None]
    try:
        ranges.sort(key=lambda b: b[0])
        return all(lo <= hi for lo, hi in ranges) and all(a[1] < b[0] for a, b in itertools.pairwise(ranges))
    except TypeError:  # None or values of mixed kinds: nothing to rely on
        return False


def _enc(v: object) -> object:
    if isinstance(v, Decimal):
        return {"decimal": str(v)}
    if isinstance(v, dt.date):
        return {"date": v.isoformat()} if not isinstance(v, dt.datetime) else {"ts": v.isoformat()}
    return v


def _dec(v: object) -> object:
    if isinstance(v, dict):
        if "decimal" in v:
            return Decimal(v["decimal"])
        if "date" in v:
            return dt.date.fromisoformat(v["date"])
        if "ts" in v:
            return dt.datetime.fromisoformat(v["ts"])
    return v


class Catalog:
    """All tables of one data directory."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        tables: dict[str, TableInfo] | None = None,
        meta: dict[str, object] | None = None,
    ):
        self.root = Path(root).resolve()
        self.tables: dict[str, TableInfo] = dict(tables or {})
        # Free-form facts about how the directory was made (e.g. the TPC-H scale factor), so a
        # generator can tell whether its output is already there. Optional in the JSON.
        self.meta: dict[str, object] = dict(meta or {})

    @classmethod
    def load(cls, root: str | os.PathLike[str]) -> Catalog:
        path = Path(root) / CATALOG_FILE
        if not path.is_file():
            raise CatalogError(
                f"{root} is not a duckflock data directory (no {CATALOG_FILE}); "
                "create one with `duckflock datagen` or `duckflock load`"
            )
        try:
            data = json.loads(path.read_text())
        except ValueError as e:
            raise CatalogError(f"{path}: not a JSON catalog: {e}") from e
        check_catalog(path, data)
        try:
            tables = {n: TableInfo.from_json(n, t) for n, t in data["tables"].items()}
        except (ValueError, TypeError, ArithmeticError) as e:  # a value of the right type that does not parse
            raise CatalogError(f"{path}: {e}") from e
        meta = dict(data.get("meta", {}))
        return cls(root, tables, meta)

    @classmethod
    def open_or_create(cls, root: str | os.PathLike[str]) -> Catalog:
        return cls.load(root) if (Path(root) / CATALOG_FILE).is_file() else cls(root)

    @classmethod
    @contextlib.contextmanager
    def updating(cls, root: str | os.PathLike[str]) -> Iterator[Catalog]:
        """The catalog of ``root`` to change, saved when the block ends without error. Read and
        written under an exclusive lock: two processes changing it at once would each save their
        own copy, and the last would drop the other's tables."""
        Path(root).mkdir(parents=True, exist_ok=True)
        with open(Path(root) / LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            catalog = cls.open_or_create(root)
            yield catalog
            catalog.save()

    def find(self, name: str) -> TableInfo | None:
        """The table of that SQL name: case-insensitive, as in DuckDB's catalog."""
        return self.tables.get(name) or next(
            (t for n, t in self.tables.items() if n.lower() == name.lower()), None
        )

    def table(self, name: str) -> TableInfo:
        info = self.find(name)
        if info is None:
            known = ", ".join(sorted(self.tables)) or "none"
            raise CatalogError(f"table {name!r} does not exist (tables: {known})")
        return info

    def put(self, info: TableInfo) -> None:
        """Add or replace a table. A hash table put without a canary was just partitioned by this
        DuckDB: it records this DuckDB's."""
        self.tables[info.name] = info.stamped()

    def path(self, relative: str) -> str:
        """Where a file of a table is: under the data directory, or the object URI as it is."""
        return file_path(self.root, relative)

    def object_prefixes(self) -> list[str]:
        """The object directories the tables name: what a DuckDB confined to the data directory
        may also read (and nothing else there)."""
        return prefixes(u for t in self.tables.values() for u in t.object_uris())

    def save(self) -> None:
        """Write atomically: a crash never leaves a half-written catalog."""
        self.root.mkdir(parents=True, exist_ok=True)
        data: dict[str, object] = {
            "version": VERSION,
            "tables": {n: t.to_json() for n, t in sorted(self.tables.items())},
        }
        if self.meta:
            data["meta"] = self.meta
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".catalog-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, default=str)
        os.chmod(tmp, 0o644)  # readable by every rank's user on shared storage
        os.replace(tmp, self.root / CATALOG_FILE)


# Key types whose partition bounds, kept in the catalog as JSON, do not read back as values DuckDB
# orders the same way: BLOB bounds are Python's text of the bytes, INTERVAL ones Python's
# timedelta text (DuckDB rejects it), nested values have no literal of ours; nanosecond times
# read back cut to Python's microseconds (a key just above a bound compares below it once cast),
# and a TIMETZ in Python's terms does not order as DuckDB orders it. Such tables are not routed by
# range.
_UNORDERED_BOUNDS = (
    "BLOB",
    "BYTEA",
    "VARBINARY",
    "BIT",
    "INTERVAL",
    "STRUCT",
    "MAP",
    "UNION",
    "TIMESTAMP_NS",
    "TIME_NS",
    "TIMETZ",
    "TIME WITH TIME ZONE",
)


def _bounds_comparable(key_type: str) -> bool:
    t = key_type.upper()
    return not t.endswith("]") and not t.startswith(_UNORDERED_BOUNDS)


def _bounds_exact(key_type: str, bounds: tuple[tuple[Any, Any] | None, ...]) -> bool:
    """Whether date and timestamp bounds are the partitions' own keys. DuckDB's Python client
    gives those outside Python's range (year 10000 on, BC) as text, which sorts otherwise, and
    +-infinity as Python's first and last day (so those days are not trusted either)."""
    if not key_type.upper().startswith(("DATE", "TIMESTAMP")):
        return True
    return all(_inside_python_range(v) for b in bounds if b is not None for v in b)


def _inside_python_range(v: object) -> bool:
    if isinstance(v, dt.datetime):
        return dt.datetime.min < v.replace(tzinfo=None) < dt.datetime.max
    return isinstance(v, dt.date) and dt.date.min < v < dt.date.max
