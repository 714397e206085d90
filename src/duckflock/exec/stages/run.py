"""One stage's run on this rank, as its life (stage.py) and its output (output.py) share it: the
connection, statistics, registered tables and profile of the run, the FROM items of its Scans, and a
stage running alongside another one."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa

from duckflock.catalog import Catalog
from duckflock.exec.reports import StageStats
from duckflock.exec.resources.runtime import Runtime
from duckflock.exec.stages import hive_prune, skew
from duckflock.exec.stages.scan_stats import ScanRecorder
from duckflock.local_duckdb import drop_views, joins_as_written
from duckflock.plan.nodes import Node, Scan
from duckflock.plan.render import render
from duckflock.plan.sql_text import everything, no_rows, read_table_files, typed_empty
from duckflock.sqltext import quote_ident as q
from duckflock.storage import objects


def scan_source(
    catalog: Catalog,
    ranks: tuple[int, ...],
    size: int,
    only: tuple[int, ...] | None = None,
    root: Node | None = None,
    recorder: ScanRecorder | None = None,
):
    """FROM item for a Scan on ``ranks`` (this rank, or all of its process's for a fused stage):
    their partitions' files (all of them when replicated; of those, the partitions ``only`` names
    when given). ``root``: the stage's plan, whose filters on hive columns skip files.
    ``recorder``: told each Scan's files and those left after pruning (a profiled query)."""
    filters = hive_prune.scan_filters(root) if root is not None else {}

    def source(scan: Scan) -> str:
        info = catalog.table(scan.table)
        if scan.replicated:
            parts: list[int] | range = range(len(info.partitions))
        else:
            parts = [p for r in ranks for p in info.partitions_of_rank(r, size)]
        if only is not None and not scan.replicated:
            parts = [p for p in parts if p in only]
        share = [catalog.path(f) for p in parts for f in info.partitions[p].files]
        files = hive_prune.prune(share, info.hive or (), filters.get(id(scan)))  # files no row of can match
        if recorder is not None:
            recorder.saw(info, share, files)
        if info.objects:  # refused when opened if replaced since they were registered
            objects.expect(objects.Stamp(*o) for o in info.objects)
        empty = not files
        if empty and info.objects:  # no request for nothing: the schema as the catalog has it
            return typed_empty(info.columns)
        if empty:  # an empty relation with the table's exact schema
            files = [catalog.path(f) for p in info.partitions for f in p.files][:1]
        if not files:  # a table without any file (zero rows loaded): its schema from the catalog
            return typed_empty(info.columns)
        rel = read_table_files(info, files)
        return no_rows(rel) if empty else rel

    return source


@dataclass
class Overlap:
    """A stage running alongside another one on this rank: the producer of a streamed exchange, or
    a stage that runs (on another connection) while that producer still does (plan/streaming.py)."""

    con: duckdb.DuckDBPyConnection  # the connection to the rank's DuckDB this stage uses
    # Set once this stage's query is planned and, if it spreads hot keys, they are known (or it ended).
    started: threading.Event = field(default_factory=threading.Event)
    after: threading.Event | None = None  # the producer's ``started``: start this stage only then
    joins_as_written: bool = False  # plan it with DuckDB's join reordering off


@dataclass
class StageRun:
    """One stage's run on this rank: its connection, statistics and the Arrow tables it registered."""

    rt: Runtime
    qid: int
    con: duckdb.DuckDBPyConnection
    stats: StageStats
    registered: list[str] = field(default_factory=list)
    views: list[str] = field(default_factory=list)
    readers: list[pa.RecordBatchReader] = field(default_factory=list)  # DuckDB results it streams
    hot: skew.HotKeys = field(default_factory=skew.HotKeys)  # the query's hot join keys (exec/stages/skew.py)
    overlap: Overlap | None = None
    joins_as_written: bool = False  # it reads a stream through joins: plan them as written
    fused: bool = False  # run once for all of the process's ranks (exec/resources/fused.py)
    sent_schema: pa.Schema | None = None  # what its exchange was closed with
    recorder: ScanRecorder | None = None  # a profiled query's: what the stage's scans read
    _take: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        if self.rt.profile:
            self.recorder = ScanRecorder()

    @contextmanager
    def profiled(self) -> Iterator[None]:
        """Around the stage's DuckDB queries, when profiled: DuckDB's profiler on, and
        ``take_profile`` after each query that scans tables takes what it read."""
        if self.recorder is None:
            yield
            return
        with self.recorder.profiled(self.con) as take:
            self._take = take
            try:
                yield
            finally:
                self._take = None

    def take_profile(self) -> None:
        """Right after a query has ended, before another statement on the connection replaces
        DuckDB's profile of it."""
        if self._take is not None:
            self._take()

    def source(self, only: tuple[int, ...] | None = None, root: Node | None = None):
        """The FROM items of this stage's Scans (``scan_source``)."""
        assert self.rt.catalog is not None
        return scan_source(self.rt.catalog, self.ranks, self.rt.size, only, root, self.recorder)

    def sql(self, root: Node) -> str:
        """The stage's query (or one of its subtrees) as DuckDB SQL over this run's Scans."""
        return render(root, self.source(root=root))

    def end_scans(self) -> None:
        if self.recorder is not None:
            self.stats.scans = self.recorder.result()
            self.stats.operator_rows = dict(self.recorder.operator_rows)

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks whose partitions the stage reads."""
        process = self.rt.process
        return process.ranks if self.fused and process is not None else (self.rt.rank,)

    @contextmanager
    def planning(self) -> Iterator[None]:
        """Around starting the stage's DuckDB query: with join reordering off where asked (a setting
        of the whole database, so only once the producer's query is planned: ``after``)."""
        if self.joins_as_written:
            with joins_as_written(self.con):
                yield
        else:
            yield

    def register(self, name: str, table: pa.Table) -> None:
        self.con.register(name, table)
        self.registered.append(name)

    def register_input(self, xid: int, name: str, rows: pa.Table | pa.RecordBatchReader) -> None:
        """An exchange's received rows under ``name``; with the rows of hot keys this rank kept in
        DuckDB for it (exec/stages/skew.py), a view of both, the kept rows cast to the received types."""
        kept = self.hot.kept.get(xid)
        if kept is None:
            self.register(name, rows)
            return
        received = f"{name}_received"
        self.register(received, rows)
        types = self.con.sql(everything(received)).types  # bound, not run: a stream stays unread
        names = rows.schema.names
        cols = ", ".join(f"CAST({q(c)} AS {t}) AS {q(c)}" for c, t in zip(names, types, strict=True))
        self.views.append(name)
        self.con.execute(
            f"CREATE TEMP VIEW {name} AS SELECT * FROM {received} UNION ALL SELECT {cols} FROM ({kept})"
        )

    def unregister_all(self) -> None:
        # A result left open (a stage that failed while reading it) would refuse, or be interrupted
        # with, the connection's next query.
        for reader in self.readers:
            with contextlib.suppress(Exception):
                reader.close()
        drop_views(self.con, self.views, self.registered)


def raise_failure(rt: Runtime, qid: int) -> None:
    """Raise the query's failure, if any rank has told this one of it."""
    error = rt.mux.told_error(qid)
    if error is not None:
        raise error


def draining(table: pa.Table, batch_rows: int | None = None) -> pa.RecordBatchReader:
    """``table``'s rows (in batches of ``batch_rows`` at most) as a stream holding each batch only
    until it has been read (the caller keeps no other reference to the table)."""
    batches, schema = table.to_batches(batch_rows), table.schema
    del table
    return pa.RecordBatchReader.from_batches(schema, _drain(batches))


def _drain(batches: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Yield the batches, letting go of each one as it is handed out."""
    batches.reverse()
    while batches:
        yield batches.pop()
