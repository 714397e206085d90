"""One query's stages on one rank, and the exchanges it receives. Stages run in the plan's order,
except that a consumer may run alongside the stage just before it, reading the exchange that stage
writes as it arrives (plan/streaming.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from duckflock.catalog import Catalog, TableInfo
from duckflock.catalog.catalog import shown
from duckflock.errors import DuckflockError, ExecutionError, duckdb_message
from duckflock.exchange.inputs import QueryInputs
from duckflock.exchange.kinds import ExchangeKind
from duckflock.exchange.spill import QuerySpill
from duckflock.exec.control.messages import RunQuery
from duckflock.exec.control.progress import report
from duckflock.exec.reports import StageStats
from duckflock.exec.resources.budget import Budget
from duckflock.exec.resources.memory import release_free_memory
from duckflock.exec.resources.runtime import Runtime
from duckflock.exec.results.result_files import ResultWriter, part_name
from duckflock.exec.stages import adaptive
from duckflock.exec.stages.run import Overlap
from duckflock.exec.stages.skew import HotKeys
from duckflock.exec.stages.stage import run_stage
from duckflock.local_duckdb import is_ctrl_c
from duckflock.plan import streaming
from duckflock.plan.nodes import ExchangeRead
from duckflock.plan.stages import Stage, StagePlan
from duckflock.storage import objects

if TYPE_CHECKING:
    from duckflock.flightsql.parts import PartInfo, PartServing


def served_in_parts(plan: StagePlan) -> bool:
    """Whether the ranks may serve the result in parts: all produce it, in no order."""
    direct = passed_on_gather(plan)
    return direct is not None and not plan.exchange(direct).ordered


def passed_on_gather(plan: StagePlan) -> int | None:
    """The gather whose rows the final stage returns as they are, when all ranks produce them: the
    exchange that part files replace, or that the driver streams into a result file."""
    root = plan.stages[-1].root
    if not isinstance(root, ExchangeRead) or plan.exchange(root.xid).kind is not ExchangeKind.GATHER:
        return None
    return None if plan.stage(plan.exchange(root.xid).producer).on_driver else root.xid


def execute_on_rank(
    rt: Runtime, cmd: RunQuery, result_file: ResultWriter | None = None
) -> tuple[pa.Table | None, list[StageStats], PartInfo | None]:
    """This rank's part of a query. A failure here is reported to every rank before raising.

    With ``cmd.parts_dir`` the ranks write the gathered rows to part files and return no result;
    with ``result_file`` (the driver) those rows stream into it as they arrive. With
    ``cmd.serve_parts`` each rank serves its part itself, and says where (the last item)."""
    rt.queries_running += 1
    rt.begin_query(cmd.qid)
    objects.begin_query()  # each object the query reads is checked once (its first open)
    try:
        try:
            query = _RankQuery(rt, cmd, result_file)
        except Exception as e:  # told to every rank like any failure, or they would wait for this one
            rt.mux.fail(cmd.qid, None, describe_error(e))
            raise ExecutionError(rt.rank, None, describe_error(e)) from None
        try:
            query.run()
        except ExecutionError:
            if query.ctrl_c:  # this rank's own Ctrl-C, come back as the failure it told the others
                raise KeyboardInterrupt from None
            raise
        except KeyboardInterrupt:
            raise query.interrupted() from None
        except Exception as e:
            # After this rank's own Ctrl-C, what its stages raise (DuckDB interrupted) is its echo.
            if is_ctrl_c(e) or query.ctrl_c:
                raise query.interrupted() from None
            raise query.failed(e) from None
        finally:
            query.close()
    finally:
        rt.end_query()
        rt.queries_running -= 1
        if rt.process is not None:
            rt.process.ended(cmd.qid)
    return query.result, query.stats, query.served


class _RankQuery:
    """One query's stages on this rank, and the exchanges it receives."""

    def __init__(self, rt: Runtime, cmd: RunQuery, result_file: ResultWriter | None):
        self.rt, self.cmd, self.plan = rt, cmd, cmd.plan
        self.result: pa.Table | None = None
        self.stats: list[StageStats] = []
        self.stage_id: int | None = None  # the stage running, for an error
        catalog = Catalog(rt.catalog.root if rt.catalog else ".", cmd.tables)
        self.rt_q = dataclasses.replace(rt, catalog=catalog, profile=cmd.profile)
        budget = rt.budget or Budget(0, 0, 0, 0)
        spill = QuerySpill(rt.spill_dir, budget.exchange_bytes)
        self.received = QueryInputs(rt.mux, cmd.qid, spill, rt.config.chunk_bytes)
        self.shuffled: set[int] = set()  # measured broadcasts that fell back to a shuffle
        self.hot = HotKeys()  # hot join keys found by the stages that spread them
        self.started: set[int] = set()
        self.ctrl_c = False  # this rank was interrupted (Ctrl-C in its process's main thread)
        self.direct = passed_on_gather(self.plan)
        self.part: ResultWriter | None = None  # opened by run(): its failure is the query's
        self.part_path: Path | None = None
        self.served: PartInfo | None = None  # this rank's part, served by itself (cmd.serve_parts)
        if cmd.parts_dir is not None and self.direct is not None:
            self.part_path = Path(cmd.parts_dir) / part_name(rt.rank)
        elif cmd.serve_parts is not None and self.direct is not None:
            where = rt.spill_dir or Path(tempfile.gettempdir())
            self.part_path = where / f"result-{cmd.serve_parts.handle}-r{rt.rank}.arrow"
        if self.direct is not None and self.part_path is not None:
            self.started.add(self.direct)  # written to files instead of gathered
        self.streamed = result_file.write if result_file is not None and self.direct is not None else None
        self.streams, self.groups = self._plan_streams()

    def _plan_streams(self) -> tuple[dict[int, int], dict[int, int]]:
        """Which stages stream an input (consumer stage id -> exchange id), and the groups of stages
        that therefore run together (first index -> last index): from a stream's producer to its
        consumer, chained when a producer is in the group before. Only a group's first stage may
        call collectives (plan/streaming.py)."""
        streams: dict[int, int] = {}
        groups: dict[int, int] = {}
        stages, catalog = self.plan.stages, self.rt_q.catalog
        assert catalog is not None
        budget = self.rt.budget
        at_once = budget.stages_at_once if budget is not None else 1
        # A build side larger than DuckDB's memory is left to partition runs (when they are on).
        memory = float("inf")
        if budget is not None and self.rt.config.partition_run_bytes != -1:
            memory = budget.duckdb_bytes
        if not self.rt.config.stream_inputs or at_once < 2:
            return streams, groups
        first = last = -1  # the latest group
        for i, stage in enumerate(stages):
            min_bytes = self.rt.config.stream_min_bytes
            xid = streaming.streamed_input(self.plan, i, catalog, self.rt.size, memory, min_bytes)
            if xid is None or xid == self.direct or self.plan.exchange(xid).shared:
                continue  # the result's own rows, or rows several stages read
            j = self._index(self.plan.exchange(xid).producer)
            start = j if j > last else first
            if i - start + 1 > at_once:
                continue  # more stages at once than the rank's memory has room for
            if j > last:
                first = j
            elif j < first or (j > first and streaming.calls_collective(self.plan.exchange(xid))):
                continue
            streams[stage.sid] = xid
            groups[first] = last = i
        return streams, groups

    def _index(self, sid: int) -> int:
        return next(i for i, s in enumerate(self.plan.stages) if s.sid == sid)

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
                    senders, ordered = plan.senders(xid, self.rt.size), plan.exchange(xid).ordered
                    streamed = self.streams.get(stage.sid) == xid
                    self.received.start(xid, senders, ordered, write, streamed, self._readers(xid))
                    self.started.add(xid)

    def _readers(self, xid: int) -> int:
        """The stages that take exchange ``xid`` on this rank: one, but for a shared exchange."""
        if not self.plan.exchange(xid).shared:
            return 1
        rank = self.rt.rank
        return sum(xid in s.inputs and (not s.on_driver or rank == 0) for s in self.plan.stages)

    def run(self) -> None:
        if self.part_path is not None:
            schema, types = self.plan.output_schema, self.plan.output_types
            if self.cmd.serve_parts is not None:  # as serve's FlightInfo gives it
                from duckflock.flightsql.metadata import with_type_names

                schema = with_type_names(schema, types)
            self.part = ResultWriter(self.part_path, schema, types, *self.rt.writer_settings(self.rt.threads))
        self.start_inputs()  # from the start, so rows sent while earlier stages run are taken in
        stages = self.plan.stages
        i = 0
        while i < len(stages):
            if i in self.groups:
                self.run_together(stages[i : self.groups[i] + 1])
                i = self.groups[i] + 1
            else:
                self.run_one(stages[i])
                i += 1
        if self.part is not None:
            self.part.commit()
            rows, self.part = self.part.rows, None
            if self.cmd.serve_parts is not None:
                self.served = self._serve_part(self.cmd.serve_parts, rows)
        self.rt.mux.flush(self.cmd.qid)

    def _serve_part(self, serving: PartServing, rows: int) -> PartInfo | None:
        """This rank's part, served by its own Flight server; None when it holds no rows."""
        assert self.part_path is not None
        if rows == 0:
            self.part_path.unlink(missing_ok=True)
            return None
        from duckflock.flightsql import parts

        host = parts.listen_host(serving, getattr(self.rt.transport, "peers", None), self.rt.rank)
        server = parts.server_for(self.rt.part_servers, serving, host)
        return server.add(serving, self.rt.rank, self.part_path, rows)

    def run_one(self, stage: Stage) -> None:
        if not adaptive.runs(stage, self.shuffled) or (self.part is not None and stage.output is None):
            if not stage.on_driver or self.rt.rank == 0:  # done, for the progress display: nothing to run
                report(self.rt.mux, self.cmd.qid, StageStats(stage.sid, self.rt.rank))
        elif stage.on_driver and self.rt.rank != 0:
            self.agree_without_rows(stage)
        else:
            self.run_stage(stage)

    def agree_without_rows(self, stage: Stage) -> None:
        """A measured broadcast from the driver: this rank holds none of it but agrees too."""
        spec = stage.output
        if spec is None or spec.fallback_target is None:
            return
        if adaptive.agree(self.rt, self.cmd.qid, 0) > spec.fallback_above:
            self.shuffled.add(spec.xid)
            self.start_inputs()

    def run_together(self, group: tuple[Stage, ...]) -> None:
        """Each stage of ``group`` on a thread and connection of its own, each starting once the one
        before it has started its query (the producer of hot keys has found them, and DuckDB
        settings for one stage's planning never meet another's); a consumer reads its streamed
        input as it arrives. A failure on any thread is told to every rank at once, which
        interrupts the others (and other ranks')."""
        errors: list[Exception] = []

        def run(stage: Stage, overlap: Overlap) -> None:
            try:
                self.run_stage(stage, overlap)
            except Exception as e:
                errors.append(e if isinstance(e, ExecutionError) else self.failed(e, stage.sid))

        threads = []
        with contextlib.ExitStack() as connections:
            try:
                before: Overlap | None = None
                for k, stage in enumerate(group):
                    xid = self.streams.get(stage.sid)
                    if xid is not None:  # the stream on the side DuckDB probes with
                        stage = dataclasses.replace(stage, root=streaming.probe_first(stage.root, xid))
                    # The first stage, and one run once per process (exec/resources/fused.py):
                    # the rank's connection.
                    own = k == 0 or (stage.once_per_process and self.rt.process is not None)
                    con = self.rt.con if own else connections.enter_context(self.rt.side_connection())
                    as_written = xid is not None and streaming.fixed_join_order(stage)
                    after = before.started if before else None
                    overlap = Overlap(con, after=after, joins_as_written=as_written)
                    threads.append(threading.Thread(target=run, args=(stage, overlap), daemon=True))
                    threads[-1].start()
                    before = overlap
            except Exception as e:  # no connection or thread for a stage: stop the ones started
                errors.insert(0, self.failed(e, group[len(threads)].sid))
            except KeyboardInterrupt:  # while starting them: the ones started stop too
                self._tell_interrupted()
                raise
            finally:
                self._join(threads)  # before their connections close
        if errors:
            raise errors[0]
        self.stats.sort(key=lambda st: st.sid)

    def _join(self, threads: list[threading.Thread]) -> None:
        """Wait for the stage threads; on Ctrl-C meanwhile, tell every rank (which interrupts
        these threads' queries) and still wait for them, then raise it."""
        interrupted: KeyboardInterrupt | None = None
        for t in threads:
            while True:
                try:  # the check too: a Ctrl-C may land on it, and must not leave a thread running
                    if not t.is_alive():
                        break
                    t.join()
                except KeyboardInterrupt as e:
                    interrupted = interrupted or e
                    self._tell_interrupted()
        if interrupted is not None:
            raise interrupted

    def _tell_interrupted(self) -> None:
        self.ctrl_c = True
        self.rt.mux.fail(self.cmd.qid, self.stage_id, "interrupted (Ctrl-C)")

    def run_stage(self, stage: Stage, overlap: Overlap | None = None) -> None:
        self.stage_id = stage.sid
        writes = self.part if stage.sid == self.direct else None
        out, st = run_stage(
            self.rt_q, self.cmd.qid, self.plan, stage, self.received, self.shuffled, writes, self.hot, overlap
        )
        self.stats.append(st)
        if st.fell_back:
            self.shuffled.add(stage.sid)  # the id of the exchange it produces
            self.start_inputs()
        report(self.rt.mux, self.cmd.qid, st)
        if stage.output is None:
            self.result = out
        release_free_memory()

    def failed(self, e: Exception, sid: int | None = None) -> ExecutionError:
        """The error to raise for ``e`` (in stage ``sid``, else the one running): another rank's,
        when it failed first; else ours, told to all."""
        cause = describe_error(e, self.received.first_error, self.plan.query)
        cause += _lake_file(cause, self.cmd.tables)
        return self.rt.mux.report_failure(self.cmd.qid, self.stage_id if sid is None else sid, cause)

    def interrupted(self) -> KeyboardInterrupt:
        """Ctrl-C here (ranks as threads, or an SPMD script's rank): the other ranks stop this
        query too (or they would go on, or wait for this one, and the next query after them)."""
        self._tell_interrupted()
        return KeyboardInterrupt()

    def close(self) -> None:
        self.received.close()
        if self.part is not None:
            self.part.abort()


def _lake_file(cause: str, tables: dict[str, TableInfo]) -> str:
    """Which lake table (at which version) the file an error names belongs to, if any: a Delta
    or Iceberg file is gone when a vacuum or snapshot expiry removed it."""
    for info in tables.values():
        at = info.source.get("version" if info.source.get("format") == "delta" else "snapshot")
        for f in (f for p in info.partitions for f in p.files) if info.source else ():
            if f in cause:
                kind = "Delta version" if info.source["format"] == "delta" else "Iceberg snapshot"
                table = shown(info.name)
                return f"\n(a data file of table {table!r} at {kind} {at}: removed or rewritten since?)"
    return ""


_FROM_PYTHON = "Detail: Python exception:"  # DuckDB's text for an error a Python reader raised


def describe_error(e: Exception, received: BaseException | None = None, query: str | None = None) -> str:
    """The cause for the user; ``received``: what a thread receiving an exchange raised, if any;
    ``query``: the user's SQL, which DuckDB's error names instead of the stage's rewrite of it."""
    if isinstance(e, duckdb.Error) and isinstance(received, Exception) and _FROM_PYTHON in str(e):
        # DuckDB reading a streamed input wraps what the receiving thread raised in its own text,
        # with a Python traceback: the cause is that error itself.
        return describe_error(received)
    if isinstance(e, duckdb.Error):
        return duckdb_message(e, query)
    if isinstance(e, DuckflockError):
        return str(e).strip()
    if isinstance(e, OSError) and re.match(r"[A-Z][A-Za-z ]* Error: ", str(e)):
        return duckdb_message(e, query)  # DuckDB's error, raised through an Arrow stream reading its result
    return f"{type(e).__name__}: {e}"
