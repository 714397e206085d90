"""A duckflock worker: serves sessions over Arrow Flight. It joins a session's peers, runs the plans
its first worker sends and, as that first worker, plans queries and returns their results to the
caller. The Flight endpoint itself (auth, peer streams, result streams) is ``transport.flight_server``;
this module is its handler.

Session life cycle, driven by the caller (``backends.flight.FlightBackend``):
  prepare (every worker) -> start (every worker) -> sql / plan (worker 0) ... -> close.
A session ends on close, when a peer is lost, or after ``idle_timeout_s`` without a call from the
caller (so a caller that disappears does not leave workers holding memory).

A query stops early (QueryCancelled, on every worker, within about a second) when its caller sends
``cancel``, when its call is cancelled or its connection lost (the caller was killed), or when the
caller has sent nothing, not even its heartbeat (``beat``, every second while a call runs), for the
idle timeout; the session ends after such a query unless the caller asked for the cancel. A worker
whose peer is lost interrupts its DuckDB at once rather than finishing a stage for nobody.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa

from duckflock.catalog import Catalog
from duckflock.config import Config
from duckflock.errors import DuckflockError, QueryCancelled, TransportError
from duckflock.exchange import pickling
from duckflock.exchange.codec import write_options
from duckflock.exchange.mux import CONTROL
from duckflock.exec.control.cancel import Cancel
from duckflock.exec.control.driver import Driver, serve
from duckflock.exec.control.messages import (
    CancelRequest,
    CloseRequest,
    ErrorReply,
    Heartbeat,
    PlanReply,
    PlanRequest,
    Prepared,
    PrepareSession,
    ProgressReply,
    ResultTicket,
    SqlReply,
    SqlRequest,
    StartSession,
    Stop,
    WorkerStatus,
    from_json,
    to_json,
)
from duckflock.exec.resources.budget import rank_share_bytes, with_share
from duckflock.exec.resources.runtime import Runtime
from duckflock.transport.base import Inbox
from duckflock.transport.flight import FlightTransport
from duckflock.transport.flight_server import FlightServer
from duckflock.versions import engine_versions

_WATCH_S = 0.5  # how often the watchdog, and a query's call, look at the caller and the peers
# A running query's caller silent this long at least (and past the idle timeout) is taken for gone:
# it sends a heartbeat every second.
_SILENT_FLOOR_S = 5.0
_RELEASE_S = 10.0  # how long an ended session's query may take to stop before its DuckDB is closed


@dataclass
class _Session:
    sid: str
    rank: int
    peers: list[str]
    config: Config
    inbox: Inbox
    ranks_on_node: int  # the session's workers on this worker's host (by address)
    runtime: Runtime | None = None
    driver: Driver | None = None
    results: dict[str, pa.Table] = field(default_factory=dict)
    last_call: float = field(default_factory=time.monotonic)
    running: int = 0  # queries being answered: a session is idle only between calls
    cancel: Cancel | None = None  # the running query's (the driver answers one at a time)
    caller_gone: bool = False  # its caller went away during a query: the session ends after it
    interrupted: bool = False  # this worker's part of a query was interrupted for a lost peer


def _busy(s: _Session) -> bool:
    """Whether the session has a query under way here (as its driver, or running stages)."""
    return s.running > 0 or (s.runtime is not None and s.runtime.queries_running > 0)


class Worker:
    """One worker process's sessions (one at a time), behind its Flight endpoint."""

    def __init__(
        self,
        location: str,
        data: str,
        token: str,
        tls: tuple[bytes, bytes] | None = None,
        tls_root: bytes | None = None,
        idle_timeout_s: float = 600.0,
    ):
        self.data = str(Path(data).resolve())
        Catalog.load(self.data)  # refuse to start on a directory that is not a data directory
        self.token = token
        self.tls_root = tls_root or (tls[0] if tls else None)
        self.idle_timeout_s = idle_timeout_s
        self._lock = threading.RLock()
        self._session: _Session | None = None
        self.server = FlightServer(location, token, self, tls)
        threading.Thread(target=self._watchdog, name="duckflock-watchdog", daemon=True).start()

    @property
    def port(self) -> int:
        return self.server.port

    def serve(self) -> None:
        self.server.serve()

    # ---- session management --------------------------------------------------------------------
    def _teardown(self, session: _Session | None, wait: bool = True) -> None:
        """End ``session`` if it is the current one. Without ``wait`` what it holds is released by
        a thread of its own: the worker is free at once, and the call ending it is not held up by
        a lost peer's streams (closing them takes seconds)."""
        with self._lock:
            if session is None or self._session is not session:
                return
            self._session = None
            self.server.close_inbox(session.sid)
        if wait:
            _release(session)
        else:
            threading.Thread(target=_release, args=(session,), name="duckflock-release", daemon=True).start()

    def _watchdog(self) -> None:
        while True:
            time.sleep(_WATCH_S)
            s = self._session
            if s is not None:
                self._look_after(s)

    def _look_after(self, s: _Session) -> None:
        """End an idle session past the idle timeout; cancel the query of a caller as silent; when a
        peer is lost, stop this worker's part of a query (DuckDB computing a stage does not look) or
        end the idle session (its caller may be gone too: a frozen worker 0 missed its close)."""
        silent = time.monotonic() - s.last_call
        cancel = s.cancel
        if s.rank == 0 and s.running == 0 and silent > self.idle_timeout_s:
            self._teardown(s)
        elif cancel is not None and silent > max(self.idle_timeout_s, _SILENT_FLOOR_S):
            s.caller_gone = True
            cancel.set(f"the session's caller sent nothing for {silent:.0f} s")
        rt = s.runtime
        if rt is None or not rt.transport.peer_failure():
            return
        if not _busy(s):  # the session cannot answer another query
            self._teardown(s)
        elif not s.interrupted:
            s.interrupted = True
            rt.interrupt()

    def _prepare(self, msg: PrepareSession) -> Prepared:
        with self._lock:  # no query of the current session starts between the check and teardown
            current = self._session
            if current is not None and current.sid != msg.session and _busy(current):
                # Taking the worker over would fail that query (its other workers wait on this one).
                raise DuckflockError(
                    f"worker at {msg.peers[msg.rank]} is answering a query of another session; "
                    "try again when it has finished (an idle session is taken over)"
                )
            self._teardown(current)
        config = replace(Config.from_env(**msg.config), restrict_to_data_dir=True)
        hosts = [p.rsplit(":", 1)[0] for p in msg.peers]
        on_node = hosts.count(hosts[msg.rank])
        with self._lock:
            inbox = self.server.open_inbox(msg.session)
            self._session = _Session(msg.session, msg.rank, msg.peers, config, inbox, on_node)
        return Prepared(rank_share_bytes(config, on_node), engine_versions())

    def _start(self, msg: StartSession) -> None:
        s = self._current(msg.session)
        transport = FlightTransport(
            s.sid, s.rank, s.peers, self.token, self.tls_root, s.inbox, s.config.peer_timeout_s
        )
        # Hosts may differ in memory: worker 0 plans broadcasts that every worker can hold.
        config = with_share(s.config, msg.smallest_share_bytes) if msg.smallest_share_bytes else s.config
        rt = Runtime.create(transport, Catalog.load(self.data), config, s.ranks_on_node)
        s.runtime = rt
        if s.rank == 0:
            s.driver = Driver(rt)
        else:
            threading.Thread(target=self._serve, args=(s,), name="duckflock-serve", daemon=True).start()

    def _serve(self, s: _Session) -> None:
        try:
            assert s.runtime is not None  # set before the session's serving thread starts
            serve(s.runtime)
        except DuckflockError:
            pass  # a lost peer ends the session; the caller hears it from worker 0
        finally:
            self._teardown(s)

    def _current(self, sid: str) -> _Session:
        s = self._session
        if s is None or s.sid != sid:
            raise DuckflockError(
                f"no session {sid} here: it ended (idle past the timeout, a lost worker, or another "
                "caller took over the idle workers) or never began; connect again"
            )
        s.last_call = time.monotonic()
        return s

    # ---- the endpoint's handler (transport.flight_server.FlightHandler) --------------------------
    def action(self, kind: str, body: bytes, caller_gone: Callable[[], bool]) -> bytes | Iterator[bytes]:
        if kind == "status":
            s = self._session
            return to_json(WorkerStatus(s.sid if s else None))
        if kind == "beat":
            self._current(from_json(Heartbeat, body).session)
            return b"ok"
        if kind == "cancel":  # the query may have ended already: then there is nothing to stop
            msg = from_json(CancelRequest, body)
            s = self._session
            cancel = s.cancel if s is not None and s.sid == msg.session else None
            if cancel is not None:
                cancel.set(msg.reason)
            return b"ok"
        if kind == "prepare":
            return to_json(self._prepare(from_json(PrepareSession, body)))
        if kind == "start":
            self._start(from_json(StartSession, body))
            return b"ok"
        if kind == "close":  # answered at once: the caller need not wait for the release
            self._teardown(self._current(from_json(CloseRequest, body).session), wait=False)
            return b"ok"
        if kind not in ("sql", "plan"):
            raise DuckflockError(f"unknown action {kind}")
        request: SqlRequest | PlanRequest = (
            from_json(SqlRequest, body) if kind == "sql" else from_json(PlanRequest, body)
        )
        s = self._current(request.session)
        if s.driver is None:
            raise DuckflockError("queries go to the session's first worker")
        if isinstance(request, SqlRequest) and request.output is not None:
            # Results travel to the caller, which writes them; a worker writes no files it is told to.
            raise DuckflockError("a worker does not write results to files; the caller does")
        if isinstance(request, SqlRequest) and isinstance(request.serve_parts, dict):  # JSON's
            from duckflock.flightsql.parts import PartServing

            request = replace(request, serve_parts=PartServing(**request.serve_parts))
        return self._answer_watching(s, request, caller_gone)

    def _answer(
        self,
        s: _Session,
        request: SqlRequest | PlanRequest,
        cancel: Cancel,
        send_progress: Callable[[ProgressReply], None] | None = None,
    ) -> SqlReply | PlanReply | ErrorReply:
        assert s.driver is not None
        with self._lock:  # seen by a second caller's _prepare, which would tear the session down
            if self._session is not s:
                gone = f"no session {s.sid} here: another caller took over the workers"
                return ErrorReply(DuckflockError(gone))
            s.running += 1  # one query at a time per session (one driver)
            s.cancel = cancel
        try:
            return s.driver.answer(request, lambda table: self._keep(s, table), send_progress, cancel)
        except DuckflockError as e:
            lost = s.runtime.transport.peer_failure() if s.runtime is not None else None
            if isinstance(e, TransportError) or lost:  # a peer is lost: the session cannot go on
                self._teardown(s, wait=False)
            if lost and not isinstance(e, TransportError | QueryCancelled):
                e = TransportError(lost)  # not what interrupting this worker's DuckDB for it raised
            return ErrorReply(e)
        finally:
            s.cancel = None
            s.running -= 1
            s.last_call = time.monotonic()
            if s.caller_gone:
                self._teardown(s, wait=False)

    def _answer_watching(
        self, s: _Session, request: SqlRequest | PlanRequest, caller_gone: Callable[[], bool]
    ) -> Iterator[bytes]:
        """The request answered by a thread of its own while this one watches the caller: a caller
        that goes away (its call cancelled, its connection lost) cancels the query. A query asking
        for progress has its ProgressReply snapshots streamed ahead of the reply."""
        replies: queue.Queue[SqlReply | PlanReply | ErrorReply | ProgressReply] = queue.Queue()
        cancel = Cancel()

        def run() -> None:
            try:
                replies.put(self._answer(s, request, cancel, replies.put))
            except Exception as e:  # a bug: the stream still ends with a reply
                replies.put(ErrorReply(DuckflockError(f"internal error: {e}")))

        threading.Thread(target=run, name="duckflock-sql", daemon=True).start()
        answered = False
        try:
            while not answered:
                try:
                    reply = replies.get(timeout=_WATCH_S)
                except queue.Empty:
                    if caller_gone():
                        break
                    continue
                answered = not isinstance(reply, ProgressReply)
                yield pickling.dumps(reply)
        finally:
            if not answered:  # the caller is gone (or the stream to it broke): nobody waits
                s.caller_gone = True
                cancel.set("the session's caller went away")

    @staticmethod
    def _keep(s: _Session, table: pa.Table) -> str:
        key = uuid.uuid4().hex
        s.results[key] = table
        return key

    def result(self, ticket: bytes) -> tuple[pa.Table, pa.ipc.IpcWriteOptions]:
        t = from_json(ResultTicket, ticket)
        s = self._current(t.session)
        table = s.results.pop(t.key, None)
        if table is None:
            raise DuckflockError("unknown or already fetched result")
        # The result crosses the caller's link: compress it as the session's exchanges are.
        return table, write_options(s.config.compression)


def _release(s: _Session) -> None:
    """What an ended session holds: its peers are told to stop, its DuckDB and streams closed once
    this worker's part of a query has stopped (a closing DuckDB refuses while a query runs)."""
    if s.driver is not None:
        with contextlib.suppress(DuckflockError):
            s.driver.broadcast_stop()
    rt = s.runtime
    if rt is None:
        return
    if s.driver is None:  # the serving loop ends after its query: the driver's Stop may never come
        rt.mux.send_obj(rt.rank, 0, CONTROL, Stop())
    deadline = time.monotonic() + _RELEASE_S
    while rt.queries_running > 0 and time.monotonic() < deadline:
        rt.interrupt()
        time.sleep(0.05)
    rt.close()
