"""The user-facing session and result objects."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import duckdb
import pyarrow as pa

from duckflock.backends.base import Backend
from duckflock.errors import DuckflockError
from duckflock.exec.control.cancel import Cancel
from duckflock.exec.hosting import forked
from duckflock.exec.reports import ProgressCallback, QueryOutcome, StageStats
from duckflock.local_duckdb import arrow_time_zone, check_exact_from_arrow, is_ctrl_c, set_time_zone
from duckflock.plan.explain import explain_plan
from duckflock.plan.stages import OnDriver
from duckflock.sqltext import quote_ident as q

if TYPE_CHECKING:
    from rich.console import Console

    from duckflock.flightsql.parts import PartServing

T = TypeVar("T")


@dataclass
class Result:
    """A finished query: the rows as Arrow plus how the query ran."""

    outcome: QueryOutcome

    def arrow(self) -> pa.Table:
        return self.outcome.table

    def df(self):
        with self._as_duckdb() as rel:
            return rel.df()

    def pl(self):
        with self._as_duckdb() as rel:
            return rel.pl()

    def fetchall(self) -> list[tuple]:
        with self._as_duckdb() as rel:
            return rel.fetchall()

    @contextmanager
    def _as_duckdb(self, as_text: bool = False) -> Iterator[duckdb.DuckDBPyRelation]:
        """The rows as a DuckDB relation of the query's own types, so that Python values, pandas and
        polars columns are those single-process DuckDB gives: its Arrow export loses some of them (a
        HUGEINT comes back as a Decimal, an INTERVAL as a MonthDayNano, a MAP as pairs, a UUID as
        text), so each column is cast back to its type. ``as_text``: each value as DuckDB writes it
        (CAST to VARCHAR), as its own printed tables show it."""
        table = self.outcome.table
        types = self.outcome.plan.output_types
        check_exact_from_arrow(table.column_names, types, "text" if as_text else "Python values")
        con = duckdb.connect()
        try:
            # The session's zone, which TIMESTAMPTZ values are given in.
            set_time_zone(con, arrow_time_zone(table.schema) or "")
            con.register("result", table.rename_columns([f"c{i}" for i in range(table.num_columns)]))
            exprs = [f"CAST(c{i} AS {types[i]})" if types else f"c{i}" for i in range(table.num_columns)]
            if as_text:
                exprs = [f"CAST({e} AS VARCHAR)" for e in exprs]
            named = [f"{e} AS {q(name)}" for e, name in zip(exprs, table.column_names, strict=True)]
            yield con.sql(f"SELECT {', '.join(named) or '*'} FROM result")
        except Exception as e:
            if is_ctrl_c(e):  # the caller's Ctrl-C, as DuckDB's client reports it
                raise KeyboardInterrupt from None
            raise
        finally:
            con.close()

    @property
    def on_driver(self) -> OnDriver | None:
        """Why the query ran whole on the driver, single-process (a construct not distributed
        yet, over tables small enough: Config.driver_fallback_bytes); None when it ran distributed."""
        return self.outcome.plan.on_driver

    @property
    def stats(self) -> list[StageStats]:
        return self.outcome.stats

    @property
    def seconds(self) -> float:
        return self.outcome.seconds

    def show(self, max_rows: int = 20, console=None) -> None:
        """The first ``max_rows`` rows as a table, each value as DuckDB writes it as text."""
        with self._as_duckdb(as_text=True) as rel:
            rows = rel.limit(max_rows).fetchall()
        table = self.outcome.table
        print_rows(table.column_names, rows, table.num_rows, console=console)

    def __repr__(self) -> str:
        t = self.outcome.table
        driver = " on the driver" if self.on_driver is not None else ""
        return (
            f"<duckflock.Result {t.num_rows} rows x {t.num_columns} columns in {self.seconds:.3f} s{driver}>"
        )


class Session:
    """Runs queries on a set of warm ranks, through one of the backends (``backends/``). Its
    queries run one at a time: calls from several threads wait their turn (the ranks are one job;
    two queries at once interleaved their messages and killed an MPI session)."""

    def __init__(self, backend: Backend):
        self._backend = backend
        self._turn = threading.Lock()
        self._closed = False
        self._cancel: Cancel | None = None  # the running call's
        self._stuck = False  # a query went on after a second Ctrl-C: the ranks are not free

    def sql(
        self,
        query: str,
        params: object = None,
        *,
        profile: bool = False,
        progress: ProgressCallback | None = None,
        output: str | None = None,
        serve_parts: PartServing | None = None,
        versions: Mapping[str, int | str] | None = None,
    ) -> Result:
        """Run a query. ``progress`` is called with ``duckflock.Progress`` snapshots (stages done and
        running, rows and bytes moved) while it runs, possibly from another thread: keep it quick.
        With ``output`` the result is written there instead of returned: one file (.parquet, .csv,
        .arrow), streamed as it arrives; or, for a directory (trailing slash or existing), a Parquet
        part file written by every rank (exec/results/result_files.py). Query parameters (``params``,
        as DuckDB's ``sql(query, params)`` takes them) are refused: write the values into the query.
        ``serve_parts`` (for ``duckflock serve``): an unordered result stays on the ranks, each
        serving its part (``Result.outcome.parts``; flightsql/parts.py). ``versions`` reads
        Delta/Iceberg tables at a version (a number: Delta version, Iceberg snapshot id) or
        timestamp (text), as ``VERSION AS OF`` / ``TIMESTAMP AS OF`` on each of their references
        would: ``versions={"t": 3}``."""
        if params is not None:
            raise DuckflockError("query parameters are not supported: write the values into the query text")
        query = _pinned(query, versions)
        with self._turn:
            self._check_open()
            return Result(
                self._call(
                    lambda cancel: self._backend.run(
                        query,
                        profile=profile,
                        progress=progress,
                        output=output,
                        cancel=cancel,
                        serve_parts=serve_parts,
                    )
                )
            )

    def interrupt(self) -> None:
        """Stop the query running now, from any thread (a no-op when none runs): it stops on every
        rank within about a second, and its ``sql()`` raises QueryCancelled. The session stays open."""
        cancel = self._cancel
        if cancel is not None:
            cancel.set("the query was cancelled (Session.interrupt())")

    def _call(self, run: Callable[[Cancel], T]) -> T:
        """``run`` with a cancel token of its own. In the main thread the call runs in a thread of
        its own while this one waits, so that a Ctrl-C lands here, in Python, at once, and cancels
        it: DuckDB's calls do not return to Python for a signal, so a main thread inside one never
        saw the Ctrl-C (a query of hours went on). After the query has stopped, KeyboardInterrupt
        (or what a signal handler raised) is raised, and the session goes on; a second one
        meanwhile is raised at once and leaves the session unusable."""
        cancel = Cancel()
        self._cancel = cancel
        try:
            if threading.current_thread() is not threading.main_thread():
                return run(cancel)
            return self._run_aside(run, cancel)
        finally:
            self._cancel = None

    def _run_aside(self, run: Callable[[Cancel], T], cancel: Cancel) -> T:
        done: list[T] = []
        failed: list[BaseException] = []
        # An event, not Thread.join: a join that a KeyboardInterrupt cut short can leave the thread
        # reported as ended while it runs on (and closing the ranks then met a busy connection).
        ended = threading.Event()

        def call() -> None:
            try:
                done.append(run(cancel))
            except BaseException as e:  # handed to the waiting thread, which raises it
                failed.append(e)
            finally:
                ended.set()

        threading.Thread(target=call, name="duckflock-query", daemon=True).start()
        interrupted: BaseException | None = None
        with forked.interruptible():  # in a CLI job's child, its signals land here too
            while not ended.is_set():
                try:
                    ended.wait(0.25)
                except BaseException as e:  # Ctrl-C, or what a signal handler raised (a timeout)
                    if interrupted is not None:
                        self._stuck = True
                        raise
                    interrupted = e
                    what = "Ctrl-C" if isinstance(e, KeyboardInterrupt) else type(e).__name__
                    cancel.set(f"interrupted ({what})")
        if interrupted is not None:
            raise interrupted
        if failed:
            raise failed[0]
        return done[0]

    @property
    def ranks(self) -> int:
        return self._backend.ranks

    def explain(
        self, query: str, analyze: bool = False, versions: Mapping[str, int | str] | None = None
    ) -> str:
        """The stage plan; with ``analyze`` the query runs and each stage shows what it really did.
        ``versions``: as ``sql``'s."""
        query = _pinned(query, versions)
        with self._turn:
            self._check_open()
            if not analyze:
                return explain_plan(self._backend.plan(query))
            outcome = self._call(lambda cancel: self._backend.run(query, profile=True, cancel=cancel))
        total = f"\ntotal {outcome.seconds:.3f} s, {outcome.table.num_rows:,} result rows"
        return explain_plan(outcome.plan, outcome.stats) + total

    def schema(self, query: str) -> tuple[pa.Schema, tuple[str, ...]]:
        """The Arrow schema of ``query``'s result and its columns' DuckDB types, from its plan:
        nothing runs."""
        with self._turn:
            self._check_open()
            plan = self._backend.plan(query)
        return plan.output_schema, plan.output_types

    def close(self) -> None:
        with self._turn:
            if not self._closed:
                self._closed = True
                self._backend.close()

    def _check_open(self) -> None:
        if self._closed:
            raise DuckflockError("the session is closed: open a new one with duckflock.connect()")
        if self._stuck:
            raise DuckflockError(
                "the session's query was interrupted twice and may still run: open a new session"
            )

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _pinned(query: str, versions: Mapping[str, int | str] | None) -> str:
    if not versions:
        return query
    from duckflock.sql.time_travel import pin  # sqlglot: loaded only where asked for

    return pin(query, versions)


def connect(
    data: str | None = None,
    ranks: int = 2,
    config: dict[str, object] | None = None,
    start_timeout: float = 60.0,
    transport: str = "mpi",
    workers: list[str] | None = None,
    token: str | None = None,
    tls_root_cert: bytes | None = None,
) -> Session:
    """A session of warm ranks.

        With ``workers=["host:port", ...]`` and ``token``: a session on running ``duckflock worker``
        processes over Arrow Flight (TLS when ``tls_root_cert`` is given). Otherwise ``ranks`` ranks over
        the data directory ``data`` on this machine: ``transport="mpi"`` as an MPI job (``mpiexec``),
        ``"threads"`` as threads of this process, ``"storage"`` as rank processes that exchange only
    through objects under ``config={"exchange_uri": DIR_OR_URI}`` (a shared directory, or s3://...).
    An MPI job puts ``ranks_per_process`` ranks in each of
        its processes (0, the default: all in one). ``config`` overrides Config fields (e.g.
        ``{"broadcast_threshold_bytes": 0}``). Use as a context manager, or call ``close()``.
    """

    if workers is not None:
        if not token:
            raise DuckflockError("workers need the shared token (token=... or --token-file)")
        from duckflock.backends.flight import FlightBackend

        return Session(FlightBackend(list(workers), token, tls_root_cert, dict(config or {})))
    if data is None:
        raise DuckflockError("connect() needs a data directory, or workers=[...]")
    if transport == "threads":
        from duckflock.backends.threads import ThreadsBackend
        from duckflock.config import Config

        return Session(ThreadsBackend(str(data), ranks, Config.from_env(**(config or {}))))
    if transport == "storage":
        from duckflock.backends import storage_job
        from duckflock.config import Config

        uri = Config.from_env(**(config or {})).exchange_uri
        if not uri:
            raise DuckflockError("transport='storage' needs config={'exchange_uri': DIR_OR_URI}")
        env = {f"DUCKFLOCK_{k.upper()}": str(v) for k, v in (config or {}).items()}
        return Session(storage_job.start(str(data), ranks, uri, env, start_timeout))
    if transport != "mpi":
        raise DuckflockError(f"unknown transport {transport!r} (use 'mpi', 'threads' or 'storage')")
    from duckflock.backends import mpi_job
    from duckflock.config import Config

    # A bad setting fails here, not in every rank as it starts.
    per_process = Config.from_env(**(config or {})).ranks_per_process
    env = {f"DUCKFLOCK_{k.upper()}": str(v) for k, v in (config or {}).items()}
    return Session(mpi_job.start(str(data), ranks, per_process, env, start_timeout))


def print_rows(names: list[str], rows: list[tuple], total: int, console: Console | None = None) -> None:
    """The first rows of a result (values already text, None for NULL) and how many there are. rich
    is imported here: a session that prints nothing does without it."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    view = Table(show_header=True, header_style="bold")
    for name in names:
        view.add_column(Text(name), overflow="fold")  # a narrow terminal wraps values, never cuts them
    for row in rows:
        view.add_row(*(Text("NULL" if v is None else str(v)) for v in row))
    console.print(view)
    more = f" (showing {len(rows)})" if total > len(rows) else ""
    console.print(f"{total} row{'' if total == 1 else 's'}{more}")
