"""What one rank owns: its transport and multiplexer, a DuckDB connection sized to its share of the
node, and the catalog. Built once per process and reused by every query (warm ranks)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from duckflock import versions
from duckflock.catalog import Catalog
from duckflock.config import Config
from duckflock.errors import DuckflockError
from duckflock.exchange.mux import QID_BITS, Mux
from duckflock.exec.resources.budget import (
    DUCKDB_MIN_BYTES,
    Budget,
    make_spill_dir,
    own_anon_bytes,
    rank_share_bytes,
    remove_spill_dir,
    with_derived_limits,
    with_share,
)
from duckflock.exec.resources.fused import ProcessRanks
from duckflock.exec.resources.memory import map_large_buffers
from duckflock.local_duckdb import local_time_zone, memory_limit, open_duckdb
from duckflock.transport.base import Transport

if TYPE_CHECKING:
    from duckflock.flightsql.parts import PartServer

_REINTERRUPT_S = 0.1


class _Interrupts:
    """Which query runs on a rank, and the thread interrupting its DuckDB while that query has
    failed. DuckDB forgets an interrupt that comes before its call starts (the call then runs to
    its end: minutes for a large join), and a failure can land between a stage's last check and
    its DuckDB call: so a failed query's connections are interrupted again every 0.1 s until the
    rank has left the query. Shared by the copies of a Runtime a query makes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._qid: int | None = None  # the query running on this rank (its tag bits, as failures say)
        self._thread: threading.Thread | None = None
        self._left = threading.Event()

    def begin(self, qid: int) -> None:
        with self._lock:
            self._qid = qid
            self._left.clear()

    def end(self) -> None:
        """The rank has left its query: stop interrupting, before the next query can start."""
        with self._lock:
            self._qid = None
            self._left.set()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()

    def failed(self, tag_qid: int, interrupt: Callable[[], None], bits: int) -> None:
        """Query ``tag_qid`` failed: interrupt now and until the rank leaves it, if it runs here
        (a query that has not begun here fails at its first check)."""
        with self._lock:
            if self._qid is None or self._qid % (1 << bits) != tag_qid or self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._repeat, args=(interrupt,), name="duckflock-interrupt", daemon=True
            )
            self._thread.start()

    def _repeat(self, interrupt: Callable[[], None]) -> None:
        interrupt()
        while not self._left.wait(_REINTERRUPT_S):
            interrupt()


@dataclass
class Runtime:
    transport: Transport
    mux: Mux
    con: duckdb.DuckDBPyConnection
    catalog: Catalog | None
    config: Config
    threads: int
    ranks_on_node: int
    # A second DuckDB with more cores: rank 0's, with every core of the node, for the driver-only
    # final stage (the node's other ranks wait idle then); also the one a process's first rank
    # runs its fused stages on (exec/resources/fused.py; on a first rank other than 0, with the
    # cores of the process's ranks). A second instance instead of SET threads up and down on the
    # first: changing the thread count costs more per query than the extra cores save on a short
    # final stage. Its threads sleep while the other stages run. Opened by the first stage that
    # needs it (0 threads: never), so a rank that has none does not pay for it; a list, shared by
    # the copies of this Runtime a query makes (dataclasses.replace), like the lock opening it.
    driver_threads: int = 0
    budget: Budget | None = None
    spill_dir: Path | None = None  # this rank's own, on node-local storage; removed by close()
    # The ranks of this process, where it runs several: the stages run once for all (exec/resources/fused.py).
    process: ProcessRanks | None = None
    queries_running: int = 0  # this rank's part of a query under way (exec/control/rank_query.py)
    profile: bool = False  # the query is profiled: its stages account their scans (exec/stages/scan_stats.py)
    _driver_con: list[duckdb.DuckDBPyConnection] = field(default_factory=list)
    _opening: threading.Lock = field(default_factory=threading.Lock)  # fused stages may run at once
    # Connections of stages running alongside another on this rank (plan/streaming.py), shared
    # by the copies of this Runtime like ``_driver_con``: a failure interrupts them too.
    _side_cons: list[duckdb.DuckDBPyConnection] = field(default_factory=list)
    _interrupts: _Interrupts = field(default_factory=_Interrupts)
    # The rank's Flight server of its parts of results (flightsql/parts.py), started by the first
    # query that serves one; shared by the copies of this Runtime.
    part_servers: list[PartServer] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.transport.rank

    @property
    def size(self) -> int:
        return self.transport.size

    @classmethod
    def create(
        cls,
        transport: Transport,
        catalog: Catalog | None,
        config: Config,
        ranks_on_node: int,
        held_bytes: int | None = None,
        process: ProcessRanks | None = None,
    ) -> Runtime:
        """``held_bytes``: what the rank holds already (exec/resources/budget.Budget.of_rank); ``process``:
        the ranks of this process, when it runs several."""
        map_large_buffers()
        cores = len(os.sched_getaffinity(0))
        threads = config.threads or max(1, cores // max(1, ranks_on_node))
        config = with_derived_limits(config, ranks_on_node)
        budget = Budget.of_rank(config, ranks_on_node, transport.size, held_bytes)
        config = replace(config, chunk_bytes=budget.chunk_bytes)
        spill_dir = make_spill_dir(config, transport.rank)
        if config.gil_switch_interval_s:  # process-wide (the caller's, for ranks as threads): Config's say
            sys.setswitchinterval(config.gil_switch_interval_s)
        mux = Mux(transport, budget.inflight_bytes, config.busy_poll_s)
        only_dir = str(catalog.root) if config.restrict_to_data_dir and catalog is not None else None

        con = open_duckdb(
            threads,
            budget.duckdb_bytes,
            only_dir,
            str(spill_dir / "duckdb"),
            config.max_temp_bytes,
            config.time_zone,
            ranks_on_node,
            object_prefixes(catalog),
        )
        driver_threads = cores if transport.rank == 0 and cores > threads else 0
        if process is not None and process.first == transport.rank and transport.rank != 0:
            driver_threads = min(cores, threads * len(process.ranks))  # for its fused stages
        rt = cls(
            transport,
            mux,
            con,
            catalog,
            config,
            threads,
            ranks_on_node,
            driver_threads,
            budget,
            spill_dir,
            process,
        )
        mux.on_failure = rt.query_failed
        return rt

    @property
    def driver_con(self) -> duckdb.DuckDBPyConnection | None:
        return self._driver_con[0] if self._driver_con else None

    def final_connection(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB for a driver-only final stage (every core of the node where that helps), or
        for the fused stages of a process's first rank."""
        with self._opening:
            if not self._driver_con and self.driver_threads:
                # A final stage runs after the rank's own DuckDB has finished the query's other
                # stages and released its memory: both get DuckDB's part of the budget.
                assert self.budget is not None and self.spill_dir is not None
                restrict = self.config.restrict_to_data_dir and self.catalog is not None
                self._driver_con.append(
                    open_duckdb(
                        self.driver_threads,
                        self.budget.duckdb_bytes,
                        str(self.catalog.root) if restrict and self.catalog is not None else None,
                        str(self.spill_dir / "driver"),
                        self.config.max_temp_bytes,
                        self.config.time_zone,
                        self.ranks_on_node,
                        object_prefixes(self.catalog),
                    )
                )
        return self._driver_con[0] if self._driver_con else self.con

    @contextmanager
    def fused_connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection for a stage run once for all of this process's ranks (exec/resources/fused.py), of
        its own (several may run at once, plan/streaming.py; interrupted with the rank's), to the
        DuckDB with more cores. While fused stages run, that DuckDB may use the memory of all
        the process's ranks: theirs wait for the fused stage, or run a stage reading its stream."""
        process, budget = self.process, self.budget
        assert process is not None and budget is not None
        wide = self.final_connection()

        def limit(nbytes: int) -> None:
            setter = wide.cursor()  # ``wide`` itself may be running a stage (no second DuckDB)
            try:
                setter.execute(f"SET memory_limit = '{memory_limit(nbytes)}'")
            finally:
                setter.close()

        ranks = len(process.ranks)
        with (
            process.running(lambda: limit(budget.duckdb_bytes * ranks), lambda: limit(budget.duckdb_bytes)),
            self.side_connection(of=wide) as con,
        ):
            yield con

    @contextmanager
    def side_connection(
        self, of: duckdb.DuckDBPyConnection | None = None
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        """A second connection to the rank's DuckDB (or to ``of``'s: same memory limit, threads and
        settings), for a stage that runs while another one does, or that needs temporary objects
        of its own; interrupted with the rank's."""
        con = (of or self.con).cursor()
        self._side_cons.append(con)
        try:
            yield con
        finally:
            self._side_cons.remove(con)
            con.close()

    def writer_settings(self, threads: int) -> tuple[int, Path | None, str, int]:
        """How the DuckDB writing a result file runs here (exec/results/result_files.ResultWriter):
        ``threads``, this rank's spill directory, the session's zone, and a memory_limit out of the
        rank's budget (it runs next to the DuckDB producing the rows: the part received exchange data
        has)."""
        memory = max(self.budget.exchange_bytes, DUCKDB_MIN_BYTES) if self.budget is not None else 0
        return threads, self.spill_dir, self.config.time_zone, memory

    def begin_query(self, qid: int) -> None:
        """This rank enters query ``qid`` (exec/control/rank_query.py); a failure told before is acted on."""
        self._interrupts.begin(qid)
        if self.mux.failure(qid) is not None:
            self.query_failed(qid % (1 << QID_BITS))

    def end_query(self) -> None:
        self._interrupts.end()

    def query_failed(self, tag_qid: int) -> None:
        """The mux's notice that a query failed on some rank (or was cancelled): its DuckDB calls
        here stop."""
        self._interrupts.failed(tag_qid, self.interrupt, QID_BITS)

    def interrupt(self) -> None:
        # Called by the mux thread while a stage's side connection may be closing: a connection
        # already closed has nothing to interrupt (and the mux thread must not die of it).
        for con in (self.con, *self._driver_con, *list(self._side_cons)):
            with contextlib.suppress(duckdb.Error):
                con.interrupt()

    def close(self) -> None:
        for server in self.part_servers:
            server.close()
        self.mux.close()
        self.transport.close()
        self.con.close()
        for con in self._driver_con:
            con.close()
        if self.spill_dir is not None:
            remove_spill_dir(self.spill_dir)


def mpi_runtimes(data: str | os.PathLike[str] | None, config: Config) -> list[Runtime]:
    """The runtimes of this process's ranks inside an MPI job (mpiexec or srun), each with the
    catalog of ``data`` (None: none): ``config.ranks_per_process`` of them, 1 where it is 0. The
    first is the process's own; ``exec.hosting.ranks.LocalRanks`` runs the others in threads."""
    from mpi4py import MPI

    from duckflock.transport.node import NodeTransport

    per_process = config.ranks_per_process or 1
    # Before any collective: a process that cannot read the catalog ends the job at once.
    catalogs = [Catalog.load(data) if data is not None else None for _ in range(per_process)]
    world = MPI.COMM_WORLD
    placed = world.allgather(per_process)
    if len(set(placed)) > 1:  # the ranks' numbers, and the communicators made below, would differ
        listed = ", ".join(f"process {p}: {k}" for p, k in enumerate(placed))
        raise DuckflockError(
            f"every process of the job must run as many ranks ({listed}): set ranks_per_process alike"
        )
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    ranks_on_node = node.Get_size() * per_process
    if config.pin_cores and per_process == 1:  # before DuckDB starts its threads, which inherit it
        usable = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {usable[node.Get_rank() % len(usable)]})
    node.Free()
    # Nodes may differ (in memory, in ranks placed on them): the planner on rank 0 must bound
    # broadcasts by the smallest share of any rank, not by its own.
    versions.check_same(
        world.allgather(versions.engine_versions()), "rank" if per_process == 1 else "process"
    )
    smallest = world.allreduce(rank_share_bytes(config, ranks_on_node), op=MPI.MIN)
    config = with_share(config, smallest)
    # Nodes may be set (or configured) to other zones: every rank takes rank 0's.
    rank0 = (config.time_zone or local_time_zone()) if world.Get_rank() == 0 else None
    config = replace(config, time_zone=world.bcast(rank0, root=0))
    transports = NodeTransport.group(per_process)
    held = own_anon_bytes() // per_process  # the process's libraries are loaded once for all of them
    process = ProcessRanks(tuple(t.rank for t in transports)) if per_process > 1 else None
    return [
        Runtime.create(t, catalog, config, ranks_on_node, held, process)
        for t, catalog in zip(transports, catalogs, strict=True)
    ]


def object_prefixes(catalog: Catalog | None) -> list[str] | None:
    """What a rank's DuckDB reads from object storage (local_duckdb.open_duckdb): the prefixes of
    the catalog's objects; everything for a rank without a catalog (loading names its inputs);
    None (no object filesystem) where the catalog names none."""
    if catalog is None:
        return []
    return catalog.object_prefixes() or None
