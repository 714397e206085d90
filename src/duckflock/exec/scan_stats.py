"""What a profiled stage's table scans read on a rank, against what they could have: files (or
objects) after hive pruning, Parquet row groups after DuckDB's statistics-based pruning, bytes.

Only when the query is profiled: the stage's connection then has DuckDB's profiler on, and after
each of its queries the ``TABLE_SCAN`` operators' ``row_groups_scanned``/``total_row_groups_to_scan``
are what DuckDB really scanned of the files it opened (row groups of files pruned before are not
counted: knowing them would take a footer request per file). Bytes: for objects, what the fsspec
adapter read of the scan's objects (storage/objects.py counts every range, always; no extra
request); for local files, DuckDB's own ``io.total_bytes_read`` of the query, given to the table when
it is the stage's only local one. Totals are the rank's share: the files of its partitions.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb

from duckflock.catalog.catalog import TableInfo, shown
from duckflock.storage import objects
from duckflock.units import human


@dataclass
class ScanStats:
    """One table's scans in one stage on one rank (or summed over ranks)."""

    table: str
    objects: bool  # of an object store: "objects" and bytes fetched; else local "files"
    files_read: int = 0
    files_total: int = 0
    row_groups_read: int | None = None  # None: DuckDB reported none (not Parquet, or no profile)
    row_groups_total: int | None = None
    bytes_fetched: int | None = None  # None: not measured (a local table beside another)
    bytes_total: int = 0
    reads: int | None = None  # range requests, for objects (each one a GET)

    def describe(self) -> str:
        """``lineitem: 3/12 objects, 41/160 row groups, 38.2 MB fetched of 203 MB``"""
        kind = "objects" if self.objects else "files"
        parts = [f"{self.files_read}/{self.files_total} {kind}"]
        if self.row_groups_total is not None:
            parts.append(f"{self.row_groups_read}/{self.row_groups_total} row groups")
        verb = "fetched" if self.objects else "read"
        got = "?" if self.bytes_fetched is None else human(self.bytes_fetched, "B")
        requests = f" in {self.reads} reads" if self.reads is not None else ""
        parts.append(f"{got} {verb}{requests} of {human(self.bytes_total, 'B')}")
        return f"{shown(self.table)}: " + ", ".join(parts)

    def add(self, other: ScanStats) -> None:
        """Sum ``other`` (the same table on another rank) into this one."""
        self.files_read += other.files_read
        self.files_total += other.files_total
        self.bytes_total += other.bytes_total
        self.row_groups_read = _plus(self.row_groups_read, other.row_groups_read)
        self.row_groups_total = _plus(self.row_groups_total, other.row_groups_total)
        self.bytes_fetched = _plus(self.bytes_fetched, other.bytes_fetched)
        self.reads = _plus(self.reads, other.reads)


def _plus(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


def summed(per_rank: Sequence[Sequence[ScanStats]]) -> list[ScanStats]:
    """Each table's scans over all ranks, in the order they first appear."""
    out: dict[str, ScanStats] = {}
    for scans in per_rank:
        for s in scans:
            if s.table in out:
                out[s.table].add(s)
            else:
                out[s.table] = ScanStats(**vars(s))
    return list(out.values())


@dataclass
class _Table:
    info: TableInfo
    total: dict[str, int] = field(default_factory=dict)  # the rank's share: path -> bytes
    read: set[str] = field(default_factory=set)
    row_groups: tuple[int, int] | None = None
    local_bytes: int | None = None  # DuckDB's count, when the table was its query's only local one
    fetched_before: dict[str, tuple[int, int]] = field(default_factory=dict)


class ScanRecorder:
    """A profiled stage's scans: ``saw`` by scan_source for every Scan it renders, ``profiled``
    around each of the stage's DuckDB queries, ``result`` at the end."""

    def __init__(self) -> None:
        self._tables: dict[str, _Table] = {}
        self._table_of: dict[str, str] = {}  # file path -> table
        self.operator_rows: dict[str, int] = {}  # DuckDB operator type -> rows its children gave it

    def saw(self, info: TableInfo, share: Sequence[str], read: Sequence[str]) -> None:
        """A Scan of ``info`` over the rank's ``share`` of its files, of which ``read`` are read."""
        t = self._tables.setdefault(info.name, _Table(info))
        new = [f for f in share if f not in t.total]
        t.total.update(zip(new, _sizes(info, new), strict=True))
        t.read.update(read)
        self._table_of.update((f, info.name) for f in share)
        uris = [f for f in read if objects.is_uri(f) and f not in t.fetched_before]
        t.fetched_before.update(objects.fetched(uris))  # before the query that reads them opens them

    @contextlib.contextmanager
    def profiled(self, con: duckdb.DuckDBPyConnection) -> Iterator[Callable[[], None]]:
        """DuckDB's profiler on ``con`` for the query run inside: call the yielded function right
        after the query ends (before any other statement on ``con`` replaces its profile)."""
        con.execute("PRAGMA enable_profiling = 'no_output'")
        try:
            yield lambda: self._take(con)
        finally:
            with contextlib.suppress(duckdb.Error):
                con.execute("PRAGMA disable_profiling")

    def _take(self, con: duckdb.DuckDBPyConnection) -> None:
        try:
            profile = json.loads(con.get_profiling_information(format="json"))
        except (duckdb.Error, ValueError):
            return  # no finished query (an error, or a result not read to its end)
        _count_inputs(profile.get("operator", []), self.operator_rows)
        seen: set[str] = set()
        for scan in _table_scans(profile.get("operator", [])):
            table = self._scan_table(scan.get("extra_info", {}))
            if table is None or "total_row_groups_to_scan" not in scan:
                continue
            t = self._tables[table]
            done, total = t.row_groups or (0, 0)
            done += int(scan["row_groups_scanned"])
            t.row_groups = (done, total + int(scan["total_row_groups_to_scan"]))
            seen.add(table)
        local = [n for n in seen if not self._tables[n].info.objects]
        if len(local) == 1:  # DuckDB counts the query's reads, not a table's
            t = self._tables[local[0]]
            t.local_bytes = _plus(t.local_bytes, int(profile.get("io", {}).get("total_bytes_read", 0)))

    def _scan_table(self, extra: dict[str, Any]) -> str | None:
        names = extra.get("Filename(s)", "")
        first = (", ".join(names) if isinstance(names, list) else str(names)).split(", ")[0]
        return self._table_of.get(first)

    def result(self) -> tuple[ScanStats, ...]:
        out = []
        for name, t in self._tables.items():
            remote = bool(t.info.objects)
            rg = t.row_groups
            reads = None
            if remote:
                now = objects.fetched(t.fetched_before)
                fetched: int | None = sum(now[u][0] - t.fetched_before[u][0] for u in now)
                reads = sum(now[u][1] - t.fetched_before[u][1] for u in now)
            else:
                fetched = t.local_bytes
            out.append(
                ScanStats(
                    name,
                    remote,
                    len(t.read),
                    len(t.total),
                    rg[0] if rg else None,
                    rg[1] if rg else None,
                    fetched,
                    sum(t.total.values()),
                    reads,
                )
            )
        return tuple(out)


def _table_scans(nodes: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for node in nodes:
        if node.get("type") == "TABLE_SCAN":
            yield node
        yield from _table_scans(node.get("children", []))


def _count_inputs(nodes: list[dict[str, Any]], into: dict[str, int]) -> None:
    """Add each operator's input rows (its children's output) under its type (for a performance
    model: rows per kind of operator; table scans count their output)."""
    for node in nodes:
        children = node.get("children", [])
        kind = str(node.get("type", ""))
        rows = (
            node.get("intermediate_rows", 0)
            if kind == "TABLE_SCAN"
            else sum(c.get("intermediate_rows", 0) for c in children)
        )
        into[kind] = into.get(kind, 0) + int(rows)
        _count_inputs(children, into)


def _sizes(info: TableInfo, paths: Sequence[str]) -> list[int]:
    """Bytes of each file: objects' as registered, local files' from the file system."""
    registered = {u: n for u, n, _ in info.objects}
    out = []
    for p in paths:
        if p in registered:
            out.append(registered[p])
        else:
            try:
                out.append(os.path.getsize(p))
            except OSError:
                out.append(0)
    return out
