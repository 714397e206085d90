"""Running one query on every rank. Rank 0 is the driver: it plans, tells the others to run the plan,
runs its own share, finishes the result and (when profiling) collects every rank's timings."""

from __future__ import annotations

import contextlib
import itertools
import pickle
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pyarrow as pa

from duckflock.catalog import Catalog
from duckflock.errors import ExecutionError, QueryCancelled
from duckflock.exchange import pickling
from duckflock.exchange.mux import COLLECTIVE, CONTROL
from duckflock.exec.control.cancel import Cancel
from duckflock.exec.control.messages import (
    DropParts,
    PlanReply,
    PlanRequest,
    ProgressReply,
    RankStats,
    RunQuery,
    SqlReply,
    SqlRequest,
    Stop,
)
from duckflock.exec.control.progress import Follower
from duckflock.exec.control.rank_query import execute_on_rank, passed_on_gather, served_in_parts
from duckflock.exec.reports import ProgressCallback, QueryOutcome, StageStats
from duckflock.exec.resources.runtime import Runtime
from duckflock.exec.results.duckdb_copy import column_count_problem
from duckflock.exec.results.result_files import (
    ResultWriter,
    is_directory,
    mark_complete,
    part_name,
    prepare_directory,
)
from duckflock.plan.nodes import DriverQuery, FunctionScan, Scan, walk
from duckflock.plan.stages import StagePlan

_LAST_REPORTS_S = 10.0

if TYPE_CHECKING:
    from duckflock.flightsql.parts import PartInfo, PartServing
    from duckflock.ingest.versions import LakeVersions
    from duckflock.sql.schema_db import SchemaDB


class Driver:
    """Rank 0's query service, used by the CLI, the SPMD API and the session server."""

    _qids = itertools.count(1)

    def __init__(self, rt: Runtime):
        self.rt = rt
        self._schema_db: SchemaDB | None = None  # made on first use
        self._catalog_stamp: float | None = None
        self._plans: dict[tuple[str, float | None, tuple[str, ...]], tuple[StagePlan, Catalog]] = {}
        self._lake: LakeVersions | None = None  # made with the schema DB

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
            self._schema_db = SchemaDB(self.rt.catalog, only, self.rt.config.time_zone)
            self._catalog_stamp = stamp
            from duckflock.ingest.versions import LakeVersions

            self._lake = LakeVersions(self.rt.catalog.root, self.rt.con)
        return self.rt.catalog

    def plan(self, sql: str) -> StagePlan:
        return self._plan(sql)[0]

    def _plan(self, sql: str) -> tuple[StagePlan, Catalog]:
        """The query's plan and the tables as it reads them: each lake table at the version this
        query reads, resolved now (ingest/versions.py). Plans are cached per query text and
        versions until the catalog changes (like prepared statements), those that depend on
        nothing else: not one holding the clock's instant, nor one reading files or running the
        query on the driver (the files' columns may have changed since)."""
        self.catalog()
        assert self._schema_db is not None and self._lake is not None and self.rt.catalog is not None
        # The planner (sqlglot) is imported by the driver only: worker ranks never load it.
        from duckflock.plan.planner import plan_query
        from duckflock.sql.query_constants import reads_clock

        tables = self._lake.for_query(sql, self.rt.catalog)
        key = (tables.text, self._catalog_stamp, tables.read_at)
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        self._schema_db.define(tables.catalog.tables.values())
        per_process = len(self.rt.process.ranks) if self.rt.process is not None else 1
        plan = plan_query(
            tables.text, tables.catalog, self._schema_db, self.rt.size, self.rt.config, per_process
        )
        plan = replace(plan, query=sql.strip(), read_at=tables.read_at)
        if reads_clock(sql) or any(
            isinstance(n, FunctionScan | DriverQuery) for s in plan.stages for n in walk(s.root)
        ):
            return plan, tables.catalog
        if len(self._plans) >= 256:
            self._plans.pop(next(iter(self._plans)))
        self._plans[key] = plan, tables.catalog
        return plan, tables.catalog

    def run(
        self,
        sql: str,
        profile: bool = False,
        progress: ProgressCallback | None = None,
        output: str | None = None,
        cancel: Cancel | None = None,
        serve_parts: PartServing | None = None,
    ) -> QueryOutcome:
        """Run a query on every rank. ``progress`` is called with snapshots while it runs, from a
        thread of the driver's, the last one with every stage done. With ``output`` its result goes
        to that file, or to part files in that directory (exec/results/result_files.py), and the
        outcome's table is empty. With ``serve_parts`` an unordered result all ranks produce stays on them,
        each rank serving its part (flightsql/parts.py): the outcome names the parts, its table is
        empty. ``cancel``, set from another thread, fails the query on every rank (which
        interrupts their DuckDB) and this raises QueryCancelled."""
        cancel = cancel or Cancel()
        try:
            return self._run(sql, profile, progress, output, cancel, serve_parts)
        except Exception as e:
            if cancel.reason is not None and not isinstance(e, QueryCancelled):
                raise QueryCancelled(cancel.reason) from None  # whatever the stop made fail
            raise

    def _run(
        self,
        sql: str,
        profile: bool,
        progress: ProgressCallback | None,
        output: str | None,
        cancel: Cancel,
        serve_parts: PartServing | None = None,
    ) -> QueryOutcome:
        t0 = time.perf_counter()
        plan, catalog = self._plan(sql)
        cancel.check()
        qid = next(self._qids)
        used = {n.table for s in plan.stages for n in walk(s.root) if isinstance(n, Scan)}
        parts_dir = str(prepare_directory(output).resolve()) if output and is_directory(output) else None
        how = self.rt.writer_settings(max(self.rt.threads, self.rt.driver_threads))  # rank 0's cores
        schema, types = plan.output_schema, plan.output_types
        result_file = ResultWriter(output, schema, types, *how) if output and not parts_dir else None
        if output or not served_in_parts(plan):
            serve_parts = None
        cmd = RunQuery(qid, plan, {t: catalog.table(t) for t in used}, profile, parts_dir, serve_parts)
        follower = Follower(self.rt.mux, qid, plan, self.rt.size, progress) if progress else None
        try:
            with cancel.hooked(lambda reason: self.rt.mux.fail(qid, None, reason)):
                table, stats, parts = self._execute(cmd, result_file, follower)
            written = 0
            if serve_parts is not None:
                table = pa.Table.from_batches([], plan.output_schema)
            if parts_dir and table is None:  # every rank wrote its part in the gather's producer
                direct = passed_on_gather(plan)
                written = sum(s.exchange.rows_out for s in stats if s.sid == direct)
                table = pa.Table.from_batches([], plan.output_schema)
            elif parts_dir:  # the driver finished the result: one part
                result_file = ResultWriter(Path(parts_dir) / part_name(0), schema, types, *how)
            assert table is not None
            _check_columns(table, plan)
            if result_file is not None:
                result_file.write_table(table)  # as computed: DuckDB's lossless types, where exchanged
                result_file.commit()
                written += result_file.rows
                table = pa.Table.from_batches([], plan.output_schema)
                result_file = None
            table = _as_duckdb_returns(table, plan)
            if parts_dir:
                mark_complete(Path(parts_dir))
        except BaseException:
            if serve_parts is not None:  # ranks that had finished serve their parts: for no one
                # Best effort (a lost rank's parts go with it): the query's own error is raised.
                with contextlib.suppress(Exception):
                    self._broadcast(DropParts(serve_parts.handle))
                drop_parts(self.rt, serve_parts.handle)
            raise
        finally:
            if result_file is not None:
                result_file.abort()
        if not profile:
            stats = [s for s in stats if s.rank == self.rt.rank]
        return QueryOutcome(table, plan, stats, time.perf_counter() - t0, written, parts)

    def _execute(
        self, cmd: RunQuery, result_file: ResultWriter | None, follower: Follower | None
    ) -> tuple[pa.Table | None, list[StageStats], list[PartInfo]]:
        """Send the query to every rank, run the driver's part, and collect the ranks' statistics
        (and the parts they serve) when they are needed."""
        mux = self.rt.mux
        ran = False
        try:
            payload = pickling.dumps(cmd)
            try:  # here, not on the ranks: a rank that cannot read the query would leave us waiting
                pickle.loads(payload)
            except Exception as e:
                raise ExecutionError(0, None, f"the query cannot be sent to the ranks: {e}") from None
            for r in range(1, self.rt.size):
                mux.send(r, 0, CONTROL, payload)
            table, stats, own = execute_on_rank(self.rt, cmd, result_file)
            parts = [own] if own is not None else []
            if _reports(cmd):  # with parts: the ranks have written theirs once they answer
                for _ in range(1, self.rt.size):
                    reply = cast(RankStats, mux.recv_obj(cmd.qid, COLLECTIVE)[1])
                    stats.extend(reply.stats)
                    parts += [reply.part] if reply.part is not None else []
            ran = True
        finally:
            if follower is not None:
                # After a success the other ranks' last reports are just behind their last data.
                follower.close(_LAST_REPORTS_S if ran else 0.0)
            mux.finish(cmd.qid)
        if follower is not None and follower.error is not None:
            raise follower.error
        return table, stats, sorted(parts, key=lambda p: p.rank)

    def answer(
        self,
        request: SqlRequest | PlanRequest,
        keep_rows: Callable[[pa.Table], str],
        send_progress: Callable[[ProgressReply], None] | None = None,
        cancel: Cancel | None = None,
    ) -> SqlReply | PlanReply:
        """A session backend's request answered; ``keep_rows`` stores a result's rows where the
        caller fetches them (a file, a Flight ticket) and says where. A SqlRequest asking for
        progress has its snapshots passed to ``send_progress`` while it runs, before this returns;
        ``cancel`` stops it (QueryCancelled)."""
        if isinstance(request, PlanRequest):
            return PlanReply(self.plan(request.query))
        progress = None
        if request.progress and send_progress is not None:
            progress = lambda p: send_progress(ProgressReply(p))  # noqa: E731
        outcome = self.run(
            request.query,
            profile=request.profile,
            progress=progress,
            output=request.output,
            cancel=cancel,
            serve_parts=request.serve_parts,
        )
        rows = keep_rows(outcome.table)
        outcome.table = outcome.table.slice(0, 0)  # the rows travel on their own
        return SqlReply(outcome, rows)

    @property
    def ranks(self) -> int:
        return self.rt.size

    def broadcast_stop(self) -> None:
        self._broadcast(Stop())

    def _broadcast(self, message: Stop | DropParts) -> None:
        for r in range(1, self.rt.size):
            self.rt.mux.send_obj(r, 0, CONTROL, message)
        self.rt.mux.flush(0)


def drop_parts(rt: Runtime, handle: str) -> None:
    """Delete this rank's parts of the query ``handle`` names."""
    for server in rt.part_servers:
        server.drop_query(handle)


def _reports(cmd: RunQuery) -> bool:
    """Whether every rank answers the driver with a RankStats once its part is done."""
    return cmd.profile or cmd.parts_dir is not None or cmd.serve_parts is not None


def _check_columns(table: pa.Table, plan: StagePlan) -> None:
    wrong = column_count_problem(table.num_columns, len(plan.output_schema))
    if wrong:
        raise ExecutionError(0, None, wrong)


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
        if isinstance(cmd, DropParts):
            drop_parts(rt, cmd.handle)
            continue
        if not isinstance(cmd, RunQuery):
            raise TypeError(f"unexpected control message {cmd!r}")
        try:
            _, stats, part = execute_on_rank(rt, cmd)
            if _reports(cmd):
                rt.mux.send_obj(0, cmd.qid, COLLECTIVE, RankStats(rt.rank, stats, part))
        except ExecutionError:
            pass  # the driver reports it; this rank is ready for the next query
        finally:
            rt.mux.finish(cmd.qid)
