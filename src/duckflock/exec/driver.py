"""Running one query on every rank. Rank 0 is the driver: it plans, tells the others to run the plan,
runs its own share, finishes the result and (when profiling) collects every rank's timings."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import duckdb
import pyarrow as pa

from duckflock.catalog import Catalog
from duckflock.errors import DuckflockError, ExecutionError, duckdb_message
from duckflock.exchange.inputs import QueryInputs
from duckflock.exchange.mux import COLLECTIVE, CONTROL
from duckflock.exchange.spill import QuerySpill
from duckflock.exec import adaptive
from duckflock.exec.memory import release_free_memory
from duckflock.exec.messages import (
    PlanReply,
    PlanRequest,
    ProgressReply,
    RankStats,
    RunQuery,
    SqlReply,
    SqlRequest,
    Stop,
)
from duckflock.exec.progress import Follower, ProgressCallback, report
from duckflock.exec.result_files import (
    ResultWriter,
    is_directory,
    mark_complete,
    part_name,
    prepare_directory,
)
from duckflock.exec.runtime import Runtime
from duckflock.exec.skew import HotKeys
from duckflock.exec.stage import StageStats, run_stage
from duckflock.plan.kinds import ExchangeKind
from duckflock.plan.nodes import ExchangeRead, Scan, walk
from duckflock.plan.stages import Stage, StagePlan

_LAST_REPORTS_S = 10.0

if TYPE_CHECKING:
    from duckflock.sql.schema_db import SchemaDB


@dataclass
class QueryOutcome:
    table: pa.Table
    plan: StagePlan
    stats: list[StageStats]  # every rank's, when profiled; the driver's otherwise
    seconds: float
    rows_written: int = 0  # rows written to the output file or directory (then ``table`` is empty)


def passed_on_gather(plan: StagePlan) -> int | None:
    """The gather whose rows the final stage returns as they are, when all ranks produce them: the
    exchange that part files replace, or that the driver streams into a result file."""
    root = plan.stages[-1].root
    if not isinstance(root, ExchangeRead) or plan.exchange(root.xid).kind is not ExchangeKind.GATHER:
        return None
    return None if plan.stage(plan.exchange(root.xid).producer).on_driver else root.xid


def execute_on_rank(
    rt: Runtime, cmd: RunQuery, result_file: ResultWriter | None = None
) -> tuple[pa.Table | None, list[StageStats]]:
    """This rank's part of a query. A failure here is reported to every rank before raising.

    With ``cmd.parts_dir`` the ranks write the gathered rows to part files and return no result;
    with ``result_file`` (the driver) those rows stream into it as they arrive."""
    query = _RankQuery(rt, cmd, result_file)
    try:
        query.run()
    except ExecutionError:
        raise
    except Exception as e:
        raise query.failed(e) from None
    finally:
        query.close()
    return query.result, query.stats


class _RankQuery:
    """One query's stages on this rank, and the exchanges it receives."""

    def __init__(self, rt: Runtime, cmd: RunQuery, result_file: ResultWriter | None):
        self.rt, self.cmd, self.plan = rt, cmd, cmd.plan
        self.result: pa.Table | None = None
        self.stats: list[StageStats] = []
        self.stage_id: int | None = None  # the stage running, for an error
        catalog = Catalog(rt.catalog.root if rt.catalog else ".", cmd.tables)
        self.rt_q = dataclasses.replace(rt, catalog=catalog)
        budget = rt.budget.exchange_bytes if rt.budget is not None else 0
        self.received = QueryInputs(rt.mux, cmd.qid, QuerySpill(rt.spill_dir, budget))
        self.shuffled: set[int] = set()  # measured broadcasts that fell back to a shuffle
        self.hot: HotKeys = {}  # hot join keys found by the stages that spread them
        self.started: set[int] = set()
        self.direct = passed_on_gather(self.plan)
        self.part: ResultWriter | None = None
        if cmd.parts_dir is not None and self.direct is not None:
            self.part = ResultWriter(Path(cmd.parts_dir) / part_name(rt.rank), self.plan.output_schema)
            self.started.add(self.direct)  # written to files instead of gathered
        self.streamed = result_file.write if result_file is not None and self.direct is not None else None

    def start_inputs(self) -> None:
        """Receive every exchange this rank reads whose producer the plans chosen so far run."""
        plan, rank = self.plan, self.rt.rank
        for stage in plan.stages:
            if stage.on_driver and rank != 0:
                continue
            for xid in stage.inputs:
                producer = plan.stage(plan.exchange(xid).producer)
                if xid not in self.started and adaptive.runs(producer, self.shuffled):
                    write = self.streamed if xid == self.direct else None
                    self.received.start(
                        xid, plan.senders(xid, self.rt.size), plan.exchange(xid).ordered, write
                    )
                    self.started.add(xid)

    def run(self) -> None:
        self.start_inputs()  # from the start, so rows sent while earlier stages run are taken in
        for stage in self.plan.stages:
            if not adaptive.runs(stage, self.shuffled) or (self.part is not None and stage.output is None):
                if not stage.on_driver or self.rt.rank == 0:  # done, for the progress display: nothing to run
                    report(self.rt.mux, self.cmd.qid, StageStats(stage.sid, self.rt.rank))
            elif stage.on_driver and self.rt.rank != 0:
                self.agree_without_rows(stage)
            else:
                self.run_stage(stage)
        if self.part is not None:
            self.part.commit()
            self.part = None
        self.rt.mux.flush(self.cmd.qid)

    def agree_without_rows(self, stage: Stage) -> None:
        """A measured broadcast from the driver: this rank holds none of it but agrees too."""
        spec = stage.output
        if spec is None or spec.fallback_target is None:
            return
        if adaptive.agree(self.rt, self.cmd.qid, 0) > spec.fallback_above:
            self.shuffled.add(spec.xid)
            self.start_inputs()

    def run_stage(self, stage: Stage) -> None:
        self.stage_id = stage.sid
        writes = self.part if stage.sid == self.direct else None
        out, st = run_stage(
            self.rt_q, self.cmd.qid, self.plan, stage, self.received, self.shuffled, writes, self.hot
        )
        self.stats.append(st)
        if st.fell_back:
            self.shuffled.add(stage.sid)  # the id of the exchange it produces
            self.start_inputs()
        report(self.rt.mux, self.cmd.qid, st)
        if stage.output is None:
            self.result = out
        release_free_memory()

    def failed(self, e: Exception) -> Exception:
        """The error to raise for ``e``: another rank's, when it failed first; else ours, told to all."""
        remote = self.rt.mux.failure(self.cmd.qid)
        if remote is not None:  # we were interrupted because another rank failed first
            return remote.error()
        cause = describe_error(e)
        self.rt.mux.fail(self.cmd.qid, self.stage_id, cause)
        return ExecutionError(self.rt.rank, self.stage_id, cause)

    def close(self) -> None:
        self.received.close()
        if self.part is not None:
            self.part.abort()


def describe_error(e: Exception) -> str:
    if isinstance(e, duckdb.Error):
        return duckdb_message(e)
    if isinstance(e, DuckflockError):
        return str(e).strip()
    return f"{type(e).__name__}: {e}"


class Driver:
    """Rank 0's query service, used by the CLI, the SPMD API and the session server."""

    _qids = itertools.count(1)

    def __init__(self, rt: Runtime):
        self.rt = rt
        self._schema_db: SchemaDB | None = None  # made on first use
        self._catalog_stamp: float | None = None
        self._plans: dict[tuple[str, float | None], StagePlan] = {}

    def catalog(self) -> Catalog:
        """The data directory's catalog, re-read when the file changed (e.g. after a load)."""
        assert self.rt.catalog is not None
        path = self.rt.catalog.root / "duckflock_catalog.json"
        stamp = path.stat().st_mtime if path.exists() else None
        if stamp != self._catalog_stamp or self._schema_db is None:
            self.rt.catalog = Catalog.load(self.rt.catalog.root)
            if self._schema_db is not None:
                self._schema_db.close()
            from duckflock.sql.schema_db import SchemaDB

            only = str(self.rt.catalog.root) if self.rt.config.restrict_to_data_dir else None
            self._schema_db = SchemaDB(self.rt.catalog, only)
            self._catalog_stamp = stamp
        return self.rt.catalog

    def plan(self, sql: str) -> StagePlan:
        """Plans are cached per query text until the catalog changes (like prepared statements)."""
        catalog = self.catalog()
        assert self._schema_db is not None
        key = (sql, self._catalog_stamp)
        plan = self._plans.get(key)
        if plan is None:
            # The planner (sqlglot) is imported by the driver only: worker ranks never load it.
            from duckflock.plan.planner import plan_query

            plan = plan_query(sql, catalog, self._schema_db, self.rt.size, self.rt.config)
            if len(self._plans) >= 256:
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = plan
        return plan

    def run(
        self,
        sql: str,
        profile: bool = False,
        progress: ProgressCallback | None = None,
        output: str | None = None,
    ) -> QueryOutcome:
        """Run a query on every rank. ``progress`` is called with snapshots while it runs, from a
        thread of the driver's, the last one with every stage done. With ``output`` its result goes
        to that file, or to part files in that directory (exec/result_files.py), and the outcome's
        table is empty."""
        t0 = time.perf_counter()
        plan = self.plan(sql)
        qid = next(self._qids)
        catalog = self.rt.catalog
        assert catalog is not None
        used = {n.table for s in plan.stages for n in walk(s.root) if isinstance(n, Scan)}
        parts_dir = str(prepare_directory(output).resolve()) if output and is_directory(output) else None
        result_file = ResultWriter(output, plan.output_schema) if output and not parts_dir else None
        cmd = RunQuery(qid, plan, {t: catalog.table(t) for t in used}, profile, parts_dir)
        follower = Follower(self.rt.mux, qid, plan, self.rt.size, progress) if progress else None
        try:
            table, stats = self._execute(cmd, result_file, follower)
            written = 0
            if parts_dir and table is None:  # every rank wrote its part in the gather's producer
                direct = passed_on_gather(plan)
                written = sum(s.exchange.rows_out for s in stats if s.sid == direct)
                table = pa.Table.from_batches([], plan.output_schema)
            elif parts_dir:  # the driver finished the result: one part
                result_file = ResultWriter(Path(parts_dir) / part_name(0), plan.output_schema)
            assert table is not None
            table = _as_duckdb_returns(table, plan)
            if result_file is not None:
                result_file.write_table(table)
                result_file.commit()
                written += result_file.rows
                table = pa.Table.from_batches([], plan.output_schema)
                result_file = None
            if parts_dir:
                mark_complete(Path(parts_dir))
        finally:
            if result_file is not None:
                result_file.abort()
        if not profile:
            stats = [s for s in stats if s.rank == self.rt.rank]
        return QueryOutcome(table, plan, stats, time.perf_counter() - t0, written)

    def _execute(
        self, cmd: RunQuery, result_file: ResultWriter | None, follower: Follower | None
    ) -> tuple[pa.Table | None, list[StageStats]]:
        """Send the query to every rank, run the driver's part, and collect the ranks' statistics
        when they are needed."""
        mux = self.rt.mux
        for r in range(1, self.rt.size):
            mux.send_obj(r, 0, CONTROL, cmd)
        ran = False
        try:
            table, stats = execute_on_rank(self.rt, cmd, result_file)
            if cmd.profile or cmd.parts_dir:  # with parts: the ranks have written theirs once they answer
                for _ in range(1, self.rt.size):
                    reply = cast(RankStats, mux.recv_obj(cmd.qid, COLLECTIVE)[1])
                    stats.extend(reply.stats)
            ran = True
        finally:
            if follower is not None:
                # After a success the other ranks' last reports are just behind their last data.
                follower.close(_LAST_REPORTS_S if ran else 0.0)
            mux.finish(cmd.qid)
        if follower is not None and follower.error is not None:
            raise follower.error
        return table, stats

    def answer(
        self,
        request: SqlRequest | PlanRequest,
        keep_rows: Callable[[pa.Table], str],
        send_progress: Callable[[ProgressReply], None] | None = None,
    ) -> SqlReply | PlanReply:
        """A session backend's request answered; ``keep_rows`` stores a result's rows where the
        caller fetches them (a file, a Flight ticket) and says where. A SqlRequest asking for
        progress has its snapshots passed to ``send_progress`` while it runs, before this returns."""
        if isinstance(request, PlanRequest):
            return PlanReply(self.plan(request.query))
        progress = None
        if request.progress and send_progress is not None:
            progress = lambda p: send_progress(ProgressReply(p))  # noqa: E731
        outcome = self.run(request.query, profile=request.profile, progress=progress, output=request.output)
        rows = keep_rows(outcome.table)
        outcome.table = outcome.table.slice(0, 0)  # the rows travel on their own
        return SqlReply(outcome, rows)

    @property
    def ranks(self) -> int:
        return self.rt.size

    def broadcast_stop(self) -> None:
        for r in range(1, self.rt.size):
            self.rt.mux.send_obj(r, 0, CONTROL, Stop())
        self.rt.mux.flush(0)


def _as_duckdb_returns(table: pa.Table, plan: StagePlan) -> pa.Table:
    """Column names and types exactly as single-process DuckDB returns them."""
    schema = plan.output_schema
    table = table.rename_columns(list(schema.names))
    if table.schema.equals(schema):
        return table
    try:
        return table.cast(schema)
    except (pa.ArrowException, ValueError) as e:  # a type duckflock cannot give as DuckDB does
        raise ExecutionError(0, None, f"the result cannot be given in DuckDB's types: {e}") from None


def serve(rt: Runtime) -> None:
    """A worker rank's loop: run what the driver sends until it says stop."""
    while True:
        _, cmd = rt.mux.recv_obj(0, CONTROL)
        if isinstance(cmd, Stop):
            return
        if not isinstance(cmd, RunQuery):
            raise TypeError(f"unexpected control message {cmd!r}")
        try:
            _, stats = execute_on_rank(rt, cmd)
            if cmd.profile or cmd.parts_dir:
                rt.mux.send_obj(0, cmd.qid, COLLECTIVE, RankStats(rt.rank, stats))
        except ExecutionError:
            pass  # the driver reports it; this rank is ready for the next query
        finally:
            rt.mux.finish(cmd.qid)
