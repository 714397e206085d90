"""What running a query reports: each stage's statistics on each rank (with what its table scans
read), the progress snapshots a caller follows, and the outcome the driver hands back.

Plain data that imports nothing else of exec/: the control messages carry it between ranks and to a
caller (exec/control/messages.py), and the layers above exec/ read it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from duckflock.catalog.catalog import shown
from duckflock.exchange.shuffle import ExchangeStats
from duckflock.units import human

if TYPE_CHECKING:
    import pyarrow as pa

    from duckflock.flightsql.parts import PartInfo
    from duckflock.plan.stages import StagePlan


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
class StageStats:
    sid: int
    rank: int
    compute_s: float = 0.0  # DuckDB producing the stage's rows (scan, join, aggregate, ...)
    total_s: float = 0.0
    exchange: ExchangeStats = field(default_factory=ExchangeStats)
    fell_back: bool = False  # a measured broadcast was larger than its bound: hashed instead
    note: str = ""  # what a measured broadcast found, for the profile
    received: dict[int, int] = field(default_factory=dict)  # rows taken from each exchange read
    streamed: tuple[int, ...] = ()  # exchanges read while their producer still ran (plan/streaming.py)
    scans: tuple[ScanStats, ...] = ()  # when profiled: what its table scans read (exec/stages/scan_stats.py)
    operator_rows: dict[str, int] = field(default_factory=dict)  # when profiled: DuckDB's, by operator type

    def set_note(self, text: str) -> None:
        self.note = text


@dataclass
class QueryOutcome:
    table: pa.Table
    plan: StagePlan
    stats: list[StageStats]  # every rank's, when profiled; the driver's otherwise
    seconds: float
    rows_written: int = 0  # rows written to the output file or directory (then ``table`` is empty)
    # The result's parts, each served by the rank holding it (then ``table`` is empty).
    parts: list[PartInfo] = field(default_factory=list)


@dataclass(frozen=True)
class Progress:
    """One snapshot. A stage is done when every rank that runs it has finished it; rows and bytes
    are what finished stage runs sent into exchanges (bytes: those that crossed the network)."""

    stages: int
    done: int
    running: int
    rows: int
    bytes: int
    seconds: float

    @property
    def finished(self) -> bool:
        return self.done == self.stages


ProgressCallback = Callable[[Progress], None]
