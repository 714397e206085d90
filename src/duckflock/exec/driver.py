"""Running one query on every rank. Rank 0 is the driver: it plans, tells the others to run the plan,
runs its own share, finishes the result and (when profiling) collects every rank's timings."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from duckflock.catalog import Catalog
from duckflock.errors import DuckflockError, ExecutionError, duckdb_message
from duckflock.exchange.inputs import QueryInputs
from duckflock.exchange.mux import COLLECTIVE, CONTROL
from duckflock.exchange.spill import QuerySpill
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
from duckflock.exec.runtime import Runtime
from duckflock.exec.stage import StageStats, run_stage
from duckflock.plan.nodes import Scan, walk
from duckflock.plan.stages import StagePlan

_LAST_REPORTS_S = 10.0


@dataclass
class QueryOutcome:
    table: pa.Table
    plan: StagePlan
    stats: list[StageStats]  # every rank's, when profiled; the driver's otherwise
    seconds: float


def execute_on_rank(rt: Runtime, cmd: RunQuery) -> tuple[pa.Table | None, list[StageStats]]:
    """This rank's part of a query. A failure here is reported to every rank before raising."""
    result = None
    stats: list[StageStats] = []
    stage_id = None
    catalog = Catalog(rt.catalog.root if rt.catalog else ".", cmd.tables)
    rt_q = dataclasses.replace(rt, catalog=catalog)
    budget = rt.budget.exchange_bytes if rt.budget is not None else 0
    received = QueryInputs(rt.mux, cmd.qid, QuerySpill(rt.spill_dir, budget))
    try:
        plan = cmd.plan
        for stage in plan.stages:  # every exchange this rank reads is taken in from the start
            if not stage.on_driver or rt.rank == 0:
                for xid in stage.inputs:
                    received.start(xid, plan.senders(xid, rt.size), plan.exchange(xid).ordered)
        for stage in plan.stages:
            if stage.on_driver and rt.rank != 0:
                continue
            stage_id = stage.sid
            out, st = run_stage(rt_q, cmd.qid, plan, stage, received)
            stats.append(st)
            report(rt.mux, cmd.qid, st)
            if stage.output is None:
                result = out
            release_free_memory()
        rt.mux.flush(cmd.qid)
    except ExecutionError:
        raise
    except Exception as e:
        remote = rt.mux.failure(cmd.qid)
        if remote is not None:  # we were interrupted because another rank failed first
            raise remote.error() from None
        cause = describe_error(e)
        rt.mux.fail(cmd.qid, stage_id, cause)
        raise ExecutionError(rt.rank, stage_id, cause) from None
    finally:
        received.close()
    return result, stats


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
        self._schema_db = None  # a SchemaDB, made on first use
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

    def run(self, sql: str, profile: bool = False, progress: ProgressCallback | None = None) -> QueryOutcome:
        """Run a query on every rank. ``progress`` is called with snapshots while it runs, from a
        thread of the driver's, the last one with every stage done."""
        t0 = time.perf_counter()
        plan = self.plan(sql)
        qid = next(self._qids)
        catalog = self.rt.catalog
        assert catalog is not None
        used = {n.table for s in plan.stages for n in walk(s.root) if isinstance(n, Scan)}
        cmd = RunQuery(qid, plan, {t: catalog.table(t) for t in used}, profile)
        mux = self.rt.mux
        follower = Follower(mux, qid, plan, self.rt.size, progress) if progress else None
        for r in range(1, self.rt.size):
            mux.send_obj(r, 0, CONTROL, cmd)
        ran = False
        try:
            table, stats = execute_on_rank(self.rt, cmd)
            if profile:
                for _ in range(1, self.rt.size):
                    reply: RankStats = mux.recv_obj(qid, COLLECTIVE)[1]
                    stats.extend(reply.stats)
            ran = True
        finally:
            if follower is not None:
                # After a success the other ranks' last reports are just behind their last data.
                follower.close(_LAST_REPORTS_S if ran else 0.0)
            mux.finish(qid)
        if follower is not None and follower.error is not None:
            raise follower.error
        assert table is not None
        table = _as_duckdb_returns(table, plan)
        return QueryOutcome(table, plan, stats, time.perf_counter() - t0)

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
        outcome = self.run(request.query, profile=request.profile, progress=progress)
        rows = keep_rows(outcome.table)
        outcome.table = None  # type: ignore[assignment]  # the rows travel on their own
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
    return table if table.schema.equals(schema) else table.cast(schema)


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
            if cmd.profile:
                rt.mux.send_obj(0, cmd.qid, COLLECTIVE, RankStats(rt.rank, stats))
        except ExecutionError:
            pass  # the driver reports it; this rank is ready for the next query
        finally:
            rt.mux.finish(cmd.qid)
