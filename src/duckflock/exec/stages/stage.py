"""Run one stage on this rank: register its exchange inputs, run its DuckDB query, stream the output
into its exchange (or return it, for the final stage)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from duckflock.arrays import arrow_array
from duckflock.catalog import Catalog
from duckflock.catalog.placement import SPLITTERS_TABLE, target_sql
from duckflock.exchange.codec import write_options
from duckflock.exchange.inputs import QueryInputs
from duckflock.exchange.kinds import ExchangeKind
from duckflock.exchange.shuffle import ExchangeWriter
from duckflock.exec.reports import StageStats
from duckflock.exec.resources.memory import release_free_memory
from duckflock.exec.resources.runtime import Runtime
from duckflock.exec.results.result_files import ResultWriter
from duckflock.exec.stages import adaptive, hive_prune, merge_runs, partition_runs, range_sort, skew
from duckflock.exec.stages.scan_stats import ScanRecorder
from duckflock.local_duckdb import arrow_exact, drop_views, fetch_as_duckdb_returns, joins_as_written
from duckflock.plan import streaming
from duckflock.plan.kinds import SkewRole
from duckflock.plan.nodes import DriverQuery, ExchangeRead, Join, Node, Scan, Sort, WithSubqueries, walk
from duckflock.plan.render import driver_sql, exchange_table, render
from duckflock.plan.skew import rescannable
from duckflock.plan.sql_text import (
    TARGET_COLUMN,
    everything,
    no_rows,
    own_share,
    read_table_files,
    typed_empty,
    with_key_hash,
    with_key_hashes,
    with_target,
)
from duckflock.plan.stages import ExchangeSpec, Stage, StagePlan
from duckflock.sqltext import quote_ident as q
from duckflock.storage import objects
from duckflock.units import human

# A test hook, never set in use: before each stage every rank writes its pid to <dir>/rank<R>.stage<S>,
# then waits while <dir>/hold exists, so a test injects a fault at an observed point instead of
# racing a sleep. Read from the rank's environment (a job's ranks inherit the caller's).
STAGE_GATE_ENV = "DUCKFLOCK_STAGE_GATE_DIR"
_SORT_INPUT = "__sort_input"  # a sort stage's rows, materialized to sample splitters from


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
class _StageRun:
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


def run_stage(
    rt: Runtime,
    qid: int,
    plan: StagePlan,
    stage: Stage,
    received: QueryInputs,
    shuffled: set[int],
    part: ResultWriter | None = None,
    hot: skew.HotKeys | None = None,
    overlap: Overlap | None = None,
) -> tuple[pa.Table | None, StageStats]:
    """``shuffled``: the measured broadcasts that fell back so far (which plan each AdaptiveJoin runs).
    ``part``: this rank's result file, written instead of sending the stage's output (a gather).
    ``hot``: the query's hot join keys so far (found by spreading stages, used by replicating ones).
    ``overlap``: the stage runs alongside another one (its inputs streamed by ``received`` are read
    as they arrive)."""
    stats = StageStats(stage.sid, rt.rank)
    t_start = time.perf_counter()
    root = adaptive.resolve(stage.root, shuffled)
    if stage.once_per_process and rt.process is not None:
        return None, _run_fused(rt, qid, plan, stage, root, stats, part, overlap)
    taken = adaptive.reads(root)
    # The final stage, on the driver, may run on a DuckDB with every core of the node.
    con = rt.final_connection() if stage.on_driver and stage.output is None else rt.con
    hot = skew.HotKeys() if hot is None else hot
    run = _StageRun(rt, qid, overlap.con if overlap else con, stats, hot=hot, overlap=overlap)
    streams = [xid for xid in taken if received.streamed(xid)]
    try:
        _wait_at_gate(rt, qid, stage.sid)
        if overlap is not None and overlap.after is not None:
            _wait_for(rt, qid, overlap.after)
        inputs = {}
        for xid in taken:
            if xid not in streams:
                inputs[xid] = received.take(xid, stats.exchange)
                stats.received[xid] = inputs[xid].num_rows
        split = None if streams or overlap else _split(rt, plan, stage, root, inputs)
        for xid in streams:
            _take_stream(run, root, xid, received)
        _register_tables(run, plan, stage, root, inputs, split, streams)
        if stage.output is None:
            return _result(run, root, inputs, plan.output_schema), stats
        if split is not None:
            try:
                with run.profiled():
                    _send_in_groups(run, plan, stage.output, root, part, split)
            finally:
                split.close(run.con)
        else:
            _send(run, plan, stage.output, root, part)
        for xid in streams:
            stats.received[xid] = received.finish_stream(xid, stats.exchange)
        return None, stats
    finally:
        if overlap is not None:
            overlap.started.set()  # also when the stage failed before its query started
        run.unregister_all()
        run.end_scans()
        for xid in taken:
            received.done(xid)
        stats.total_s = time.perf_counter() - t_start


def _run_fused(
    rt: Runtime,
    qid: int,
    plan: StagePlan,
    stage: Stage,
    root: Node,
    stats: StageStats,
    part: ResultWriter | None,
    overlap: Overlap | None,
) -> StageStats:
    """The stage once for all of this process's ranks, on its first (exec/resources/fused.py); the others
    wait for it, then end their output (or part file) with no rows."""
    process, spec = rt.process, stage.output
    assert process is not None and spec is not None
    t_start = time.perf_counter()
    try:
        _wait_at_gate(rt, qid, stage.sid)
        if rt.rank != process.first:
            if overlap is not None:
                overlap.started.set()  # no query here for the stages after it to wait for
            schema = process.wait(qid, stage.sid, lambda: rt.mux.told_error(qid))
            run = _StageRun(rt, qid, rt.con, stats)
            _close(run, part or _writer(run, plan, spec, spec.kind), schema)
            stats.set_note(f"run by rank {process.first} for {process.describe()}")
            return stats
        sent = None
        try:
            if overlap is not None and overlap.after is not None:
                _wait_for(rt, qid, overlap.after)
            with rt.fused_connection() as con:
                run = _StageRun(rt, qid, con, stats, overlap=overlap, fused=True)
                try:
                    _send(run, plan, spec, root, part)
                finally:
                    run.unregister_all()
                    run.end_scans()
                sent = run.sent_schema
        finally:
            process.finished(qid, stage.sid, sent)
            if overlap is not None:
                overlap.started.set()  # also when it failed before its query started
        stats.set_note(f"run once for {process.describe()}" + (f"; {stats.note}" if stats.note else ""))
    finally:
        stats.total_s = time.perf_counter() - t_start
    return stats


def _raise_failure(rt: Runtime, qid: int) -> None:
    """Raise the query's failure, if any rank has told this one of it."""
    error = rt.mux.told_error(qid)
    if error is not None:
        raise error


def _split(
    rt: Runtime, plan: StagePlan, stage: Stage, root: Node, inputs: dict[int, pa.Table]
) -> partition_runs.PartitionGroups | None:
    """Whether the stage runs once per group of this rank's partitions (exec/stages/partition_runs.py)."""
    limit = rt.config.partition_run_bytes
    if limit == 0 and rt.budget is not None:
        limit = rt.budget.duckdb_bytes
    if limit <= 0 or rt.catalog is None:
        return None
    return partition_runs.split(root, stage, plan, rt.catalog, inputs, rt.rank, rt.size, limit)


def _take_stream(run: _StageRun, root: Node, xid: int, received: QueryInputs) -> None:
    """Register a streamed input: as a stream once it has proved larger than every build side on
    its path, or whole, should it end before (then DuckDB plans the stage as usual)."""
    catalog = run.rt.catalog
    assert catalog is not None
    builds = streaming.build_rows(root, xid, catalog, run.rt.size, lambda x: run.stats.received.get(x, 0))
    rows = received.take_stream(xid, builds)
    run.register_input(xid, exchange_table(xid), rows)
    if isinstance(rows, pa.RecordBatchReader):
        run.stats.streamed += (xid,)
        run.joins_as_written = run.overlap is not None and run.overlap.joins_as_written


def _register_tables(
    run: _StageRun,
    plan: StagePlan,
    stage: Stage,
    root: Node,
    inputs: dict[int, pa.Table],
    split: partition_runs.PartitionGroups | None,
    streams: list[int],
) -> None:
    """Register the inputs taken whole; those DuckDB may read as a draining stream leave ``inputs``."""
    for xid in list(inputs):
        name = split.whole(xid) if split and xid in split.filters else exchange_table(xid)
        if stage.output is not None and split is None and _drains(run, plan, root, xid, streams):
            run.register_input(xid, name, _draining(inputs.pop(xid)))
        else:
            run.register_input(xid, name, inputs[xid])


def _drains(run: _StageRun, plan: StagePlan, root: Node, xid: int, streams: list[int]) -> bool:
    """Whether the stage takes input ``xid`` as a stream that lets go of each batch once DuckDB has
    read it, so that the hash table DuckDB builds of it does not sit next to a whole copy of its
    rows (the skewed join at SF 10 on 2 ranks: 2 x 90 MB of part). DuckDB then knows no row count
    (it estimates one row, and builds on it): only where that changes no plan, for an input read
    once, either in a stage whose joins run as written (it streams an input through them), or as
    the broadcast side of the stage's only join, with no other input a stream."""
    if sum(isinstance(n, ExchangeRead) and n.xid == xid for n in walk(root)) != 1:
        return False
    if run.joins_as_written:
        return True
    joins = [n for n in walk(root) if isinstance(n, Join)]
    if streams or len(joins) != 1 or plan.exchange(xid).kind is not ExchangeKind.BROADCAST:
        return False
    # A side of that join, not the input of a subquery (which DuckDB may scan again).
    subqueries = any(isinstance(n, WithSubqueries) and n.subqueries for n in walk(root))
    return not subqueries and any(isinstance(n, ExchangeRead) and n.xid == xid for n in walk(joins[0]))


def _draining(table: pa.Table) -> pa.RecordBatchReader:
    """``table``'s rows as a stream holding each batch only until it has been read (the caller
    keeps no other reference to the table)."""
    batches, schema = table.to_batches(), table.schema
    del table
    return pa.RecordBatchReader.from_batches(schema, _drain(batches))


def _result(run: _StageRun, root: Node, inputs: dict[int, pa.Table], schema: pa.Schema) -> pa.Table:
    """The final stage's rows, for the user (``schema``: what single-process DuckDB returns)."""
    if isinstance(root, ExchangeRead):
        # rows arrive in their final order: no DuckDB pass, unless a type needs converting back
        table = inputs[root.xid]
        if table.schema.types != schema.types:
            table = fetch_as_duckdb_returns(run.con, everything(exchange_table(root.xid)), True)
        return table
    t0 = time.perf_counter()
    if isinstance(root, Sort) and root.merge and isinstance(root.child, ExchangeRead):
        merged = merge_runs.merge(inputs[root.child.xid], root.keys, root.columns)
        if merged is not None and merged.schema.types == schema.types:
            run.stats.compute_s += time.perf_counter() - t0
            run.stats.set_note(f"merged the ranks' sorted runs of x{root.child.xid}")
            return merged
    if isinstance(root, DriverQuery):
        result = _driver_result(run, root)
    else:
        with run.profiled():
            result = fetch_as_duckdb_returns(run.con, _stage_sql(run, root), ended=run.take_profile)
    run.stats.compute_s += time.perf_counter() - t0
    return result


def _driver_result(run: _StageRun, root: DriverQuery) -> pa.Table:
    """The user's text run by DuckDB as written, each table it names a temporary view of that name
    on the stage's connection (where the exchanges that gathered them are registered), dropped
    afterwards. Wrapped in a WITH of those tables instead, the text's own CTEs read twice would be
    computed once per read, not once (a sampled CTE joined with itself matched 1 row of 5)."""
    source = run.source(root=root)
    for name, child in root.inputs:
        run.con.execute(f"CREATE OR REPLACE TEMP VIEW {q(name)} AS {render(child, source)}")
        run.views.append(q(name))  # dropped with the stage's registrations (_StageRun.unregister_all)
    with run.profiled():
        return fetch_as_duckdb_returns(run.con, driver_sql(root), keep_order=True, ended=run.take_profile)


def _stage_sql(run: _StageRun, root: Node) -> str:
    return render(root, run.source(root=root))


def _send(run: _StageRun, plan: StagePlan, spec: ExchangeSpec, root: Node, part: ResultWriter | None) -> None:
    """Stream the stage's rows into its exchange (or into ``part``) while DuckDB produces them."""
    with run.profiled():
        _send_rows(run, plan, spec, root, part)


def _send_rows(
    run: _StageRun, plan: StagePlan, spec: ExchangeSpec, root: Node, part: ResultWriter | None
) -> None:
    rt, stats = run.rt, run.stats
    sql = _stage_sql(run, root)
    routed = _routed(run, spec, sql)
    queried = isinstance(routed, str)  # else a sort's rows, their scans' profile already taken
    t0 = time.perf_counter()  # from here on DuckDB produces the rows as they are read
    with run.planning():
        reader = _reader(run, routed)
    del routed  # a materialized sort input lives on only in the reader's batches
    if skew.applies(spec):
        again = spec.skew is SkewRole.SPREAD and rescannable(root)
        restart = _restart_without(run, spec, sql) if again else None
        reader = skew.route(rt, run.qid, spec, reader, run.hot, stats.set_note, restart)
    if run.overlap is not None:
        run.overlap.started.set()
    out = _Output(spec.kind, [], reader.schema)
    if spec.fallback_target is not None:
        out = _measure(run, spec, reader)
    writer = part or _writer(run, plan, spec, out.kind)
    written = _write(run, writer, out, reader, t0)
    if queried:
        run.take_profile()
    _close(run, writer, out.schema)
    _note_broadcast(run, out.kind, spec, written)


def _restart_without(run: _StageRun, spec: ExchangeSpec, sql: str) -> skew.Restart:
    """How a spreading stage's query restarts without the rows of some key hashes, which the stage
    reading its exchange reads again itself (exec/stages/skew.py)."""
    target = spec.target
    assert target is not None

    def restart(hashes: np.ndarray) -> tuple[pa.RecordBatchReader, str]:
        without = with_key_hashes(sql, spec.keys, target, hashes.tolist(), among=False)
        with run.planning():
            reader = _reader(run, _routed(run, spec, without))
        return reader, with_key_hashes(sql, spec.keys, target, hashes.tolist(), among=True)

    return restart


def _send_in_groups(
    run: _StageRun,
    plan: StagePlan,
    spec: ExchangeSpec,
    root: Node,
    part: ResultWriter | None,
    split: partition_runs.PartitionGroups,
) -> None:
    """``_send`` once per group of partitions, all into one writer: ``split`` rules out hot keys,
    measured broadcasts, sorts and streams."""
    rt = run.rt
    assert rt.catalog is not None
    writer = part or _writer(run, plan, spec, spec.kind)
    written = 0
    schema = None
    for group in split.groups:
        _raise_failure(rt, run.qid)  # another rank failed meanwhile: no more runs
        split.read_group(run.con, group)
        sql = render(root, run.source(group, root))
        t0 = time.perf_counter()
        reader = _reader(run, _routed(run, spec, sql))
        try:
            schema = reader.schema
            written += _write(run, writer, _Output(spec.kind, [], schema), reader, t0)
            run.take_profile()
        finally:
            reader.close()  # an open result would keep its views from being dropped
        release_free_memory()  # the run's hash tables, before the next run builds its own
    assert schema is not None
    _close(run, writer, schema)
    run.stats.set_note(split.note())
    _note_broadcast(run, spec.kind, spec, written)


def _writer(run: _StageRun, plan: StagePlan, spec: ExchangeSpec, kind: ExchangeKind) -> ExchangeWriter:
    rt = run.rt
    return ExchangeWriter(
        rt.mux,
        run.qid,
        spec.xid,
        kind,
        plan.receivers(spec.xid, rt.size),
        rt.config.chunk_bytes,
        write_options(rt.config.compression),
        run.stats.exchange,
    )


def _close(run: _StageRun, writer: ExchangeWriter | ResultWriter, schema: pa.Schema) -> None:
    run.sent_schema = schema
    if isinstance(writer, ExchangeWriter):
        writer.close(schema)
    else:
        run.stats.exchange.rows_out = writer.rows


def _note_broadcast(run: _StageRun, kind: ExchangeKind, spec: ExchangeSpec, written: int) -> None:
    """A broadcast the planner could not measure first, larger than the threshold: say so."""
    threshold = run.rt.config.broadcast_threshold_bytes
    if kind is ExchangeKind.BROADCAST and spec.fallback_target is None and written > threshold:
        run.stats.note = (
            f"x{spec.xid}: broadcast {human(written, 'B')} from this rank, over the threshold of "
            f"{human(threshold, 'B')}; not measured in advance: no shuffle gives the same rows"
        )


def _routed(run: _StageRun, spec: ExchangeSpec, sql: str) -> str | pa.Table:
    """The stage's query with each row's target rank appended where rows are routed; for a sort,
    its rows (already computed) with their targets."""
    size = run.rt.size
    if spec.kind in (ExchangeKind.HASH, ExchangeKind.RANGE):
        assert spec.target is not None
        if skew.applies(spec):  # the key hashes name hot keys (exec/stages/skew.py)
            sql = with_key_hash(sql, spec.keys, spec.target)
        sql = with_target(sql, target_sql(spec.keys, spec.target, size))
        # every rank holds all rows: keep this rank's share, send no copies
        return own_share(sql, run.rt.rank) if spec.local else sql
    if spec.fallback_target is not None:  # measured: each row's target, should it be hashed
        return with_target(sql, target_sql(spec.fallback_keys, spec.fallback_target, size))
    if spec.kind is ExchangeKind.SORT:
        return _sorted(run, spec, sql)
    return sql


def _sorted(run: _StageRun, spec: ExchangeSpec, sql: str) -> str | pa.Table:
    """Splitters come from samples of this stage's output: materialize it first."""
    t0 = time.perf_counter()
    table = run.con.sql(arrow_exact(run.con, sql, exchanged=True)).to_arrow_table()
    run.take_profile()
    fast = range_sort.fast_targets(run.rt, run.qid, table, spec.keys)
    if fast is not None:  # one numeric key: bucket with numpy, no second DuckDB pass
        routed: str | pa.Table = table.append_column(TARGET_COLUMN, arrow_array(fast))
    else:
        run.register(_SORT_INPUT, table)
        targets = range_sort.target_sql(run.rt, run.qid, _SORT_INPUT, spec.keys)
        run.registered.append(SPLITTERS_TABLE)
        routed = with_target(everything(_SORT_INPUT), targets)
    run.stats.compute_s += time.perf_counter() - t0
    return routed


def _reader(run: _StageRun, routed: str | pa.Table) -> pa.RecordBatchReader:
    batch_rows = run.rt.config.batch_rows
    if isinstance(routed, str):
        run.readers.append(
            run.con.sql(arrow_exact(run.con, routed, exchanged=True)).to_arrow_reader(batch_rows)
        )
        return run.readers[-1]
    # each batch is dropped once split, so the output is not held twice
    return pa.RecordBatchReader.from_batches(routed.schema, _drain(routed.to_batches(batch_rows)))


@dataclass
class _Output:
    """What the stage sends: through which kind of exchange, the batches already read, the schema."""

    kind: ExchangeKind
    held: list[pa.RecordBatch]
    schema: pa.Schema
    strip_target: bool = False  # a measured broadcast drops the target computed for a fall-back


def _measure(run: _StageRun, spec: ExchangeSpec, reader: pa.RecordBatchReader) -> _Output:
    """A measured broadcast: all ranks agree on its total size, then broadcast or hash it."""
    stats, threshold = run.stats, spec.fallback_above
    held, local = adaptive.measure(reader, threshold)
    total = adaptive.agree(run.rt, run.qid, local)
    stats.fell_back = total > threshold
    how = "hashed on the join keys instead of broadcast" if stats.fell_back else "broadcast"
    at_least = "at least " if stats.fell_back else ""  # ranks stop reading past the threshold
    total_s = f"{at_least}{human(total, 'B')}"
    stats.note = f"x{spec.xid}: {total_s} on all ranks, threshold {human(threshold, 'B')}: {how}"
    if stats.fell_back:
        return _Output(ExchangeKind.HASH, held, reader.schema)
    held = [b.drop_columns([TARGET_COLUMN]) for b in held]
    schema = reader.schema.remove(len(reader.schema) - 1)
    return _Output(ExchangeKind.BROADCAST, held, schema, strip_target=True)


def _write(
    run: _StageRun,
    writer: ExchangeWriter | ResultWriter,
    out: _Output,
    reader: pa.RecordBatchReader,
    t0: float,
) -> int:
    """Hand every batch to the writer; the bytes written. The time since ``t0`` not spent writing
    is DuckDB producing the batches: compute."""
    written = 0
    for batch in out.held:
        writer.write(batch)
        written += batch.nbytes
    out.held.clear()
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        t1 = time.perf_counter()
        run.stats.compute_s += t1 - t0
        if out.strip_target:
            batch = batch.drop_columns([TARGET_COLUMN])
        writer.write(batch)
        written += batch.nbytes
        t0 = time.perf_counter()
    run.stats.compute_s += time.perf_counter() - t0
    return written


def _wait_at_gate(rt: Runtime, qid: int, sid: int) -> None:
    """The stage gate test hook (STAGE_GATE_ENV), when set: announce this stage, then hold while the
    test says so."""
    directory = os.environ.get(STAGE_GATE_ENV)
    if not directory:
        return
    gate = Path(directory)
    (gate / f"rank{rt.rank}.stage{sid}").write_text(str(os.getpid()))  # the process a test may kill
    while (gate / "hold").exists():
        _raise_failure(rt, qid)
        time.sleep(0.02)


def _wait_for(rt: Runtime, qid: int, event: threading.Event) -> None:
    """Wait for another stage of this rank to start its query; raise if the query failed meanwhile."""
    while not event.wait(0.05):
        _raise_failure(rt, qid)


def _drain(batches: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Yield the batches, letting go of each one as it is handed out."""
    batches.reverse()
    while batches:
        yield batches.pop()
