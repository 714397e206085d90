"""One stage's life on this rank: wait for its turn, take its exchange inputs and register them,
run its DuckDB query, and hand the rows to its output (output.py), or return them for the final
stage."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pyarrow as pa

from duckflock.exchange.inputs import QueryInputs
from duckflock.exchange.kinds import ExchangeKind
from duckflock.exec.reports import StageStats
from duckflock.exec.resources.runtime import Runtime
from duckflock.exec.results.result_files import ResultWriter
from duckflock.exec.stages import adaptive, merge_runs, output, partition_runs, skew
from duckflock.exec.stages.run import Overlap, StageRun, draining, raise_failure
from duckflock.local_duckdb import fetch_as_duckdb_returns
from duckflock.plan import streaming
from duckflock.plan.nodes import DriverQuery, ExchangeRead, Join, Node, Sort, WithSubqueries, walk
from duckflock.plan.render import driver_sql, exchange_table, render
from duckflock.plan.sql_text import everything
from duckflock.plan.stages import Stage, StagePlan
from duckflock.sqltext import quote_ident as q

# A test hook, never set in use: before each stage every rank writes its pid to <dir>/rank<R>.stage<S>,
# then waits while <dir>/hold exists, so a test injects a fault at an observed point instead of
# racing a sleep. Read from the rank's environment (a job's ranks inherit the caller's).
STAGE_GATE_ENV = "DUCKFLOCK_STAGE_GATE_DIR"


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
    run = StageRun(rt, qid, overlap.con if overlap else con, stats, hot=hot, overlap=overlap)
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
                    output.send_in_groups(run, plan, stage.output, root, part, split)
            finally:
                split.close(run.con)
        else:
            output.send(run, plan, stage.output, root, part)
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
            run = StageRun(rt, qid, rt.con, stats)
            output.end_without_rows(run, plan, spec, part, schema)
            stats.set_note(f"run by rank {process.first} for {process.describe()}")
            return stats
        sent = None
        try:
            if overlap is not None and overlap.after is not None:
                _wait_for(rt, qid, overlap.after)
            with rt.fused_connection() as con:
                run = StageRun(rt, qid, con, stats, overlap=overlap, fused=True)
                try:
                    output.send(run, plan, spec, root, part)
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


def _take_stream(run: StageRun, root: Node, xid: int, received: QueryInputs) -> None:
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
    run: StageRun,
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
            run.register_input(xid, name, draining(inputs.pop(xid)))
        else:
            run.register_input(xid, name, inputs[xid])


def _drains(run: StageRun, plan: StagePlan, root: Node, xid: int, streams: list[int]) -> bool:
    """Whether the stage takes input ``xid`` as a stream that lets go of each batch once DuckDB has
    read it, so that the hash table DuckDB builds of it does not sit next to a whole copy of its
    rows (a broadcast build side is held by every rank). DuckDB then knows no row count
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


def _result(run: StageRun, root: Node, inputs: dict[int, pa.Table], schema: pa.Schema) -> pa.Table:
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
            result = fetch_as_duckdb_returns(run.con, run.sql(root), ended=run.take_profile)
    run.stats.compute_s += time.perf_counter() - t0
    return result


def _driver_result(run: StageRun, root: DriverQuery) -> pa.Table:
    """The user's text run by DuckDB as written, each table it names a temporary view of that name
    on the stage's connection (where the exchanges that gathered them are registered), dropped
    afterwards. Wrapped in a WITH of those tables instead, the text's own CTEs read twice would be
    computed once per read, not once (a sampled CTE joined with itself matched 1 row of 5)."""
    source = run.source(root=root)
    for name, child in root.inputs:
        run.con.execute(f"CREATE OR REPLACE TEMP VIEW {q(name)} AS {render(child, source)}")
        run.views.append(q(name))  # dropped with the stage's registrations (StageRun.unregister_all)
    with run.profiled():
        return fetch_as_duckdb_returns(run.con, driver_sql(root), keep_order=True, ended=run.take_profile)


def _wait_at_gate(rt: Runtime, qid: int, sid: int) -> None:
    """The stage gate test hook (STAGE_GATE_ENV), when set: announce this stage, then hold while the
    test says so."""
    directory = os.environ.get(STAGE_GATE_ENV)
    if not directory:
        return
    gate = Path(directory)
    (gate / f"rank{rt.rank}.stage{sid}").write_text(str(os.getpid()))  # the process a test may kill
    while (gate / "hold").exists():
        raise_failure(rt, qid)
        time.sleep(0.02)


def _wait_for(rt: Runtime, qid: int, event: threading.Event) -> None:
    """Wait for another stage of this rank to start its query; raise if the query failed meanwhile."""
    while not event.wait(0.05):
        raise_failure(rt, qid)
