"""A duckflock worker: serves sessions over Arrow Flight. It joins a session's peers, runs the plans
its first worker sends and, as that first worker, plans queries and returns their results to the
caller. The Flight endpoint itself (auth, peer streams, result streams) is ``transport.flight_server``;
this module is its handler.

Session life cycle, driven by the caller (``backends.flight.FlightBackend``):
  prepare (every worker) -> start (every worker) -> sql / plan (worker 0) ... -> close.
A session ends on close, when a peer is lost, or after ``idle_timeout_s`` without a call from the
caller (so a caller that disappears does not leave workers holding memory).
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
from duckflock.errors import DuckflockError, TransportError
from duckflock.exchange import pickling
from duckflock.exchange.codec import write_options
from duckflock.exec.budget import rank_share_bytes, with_share
from duckflock.exec.driver import Driver, serve
from duckflock.exec.messages import (
    CloseRequest,
    ErrorReply,
    PlanReply,
    PlanRequest,
    Prepared,
    PrepareSession,
    ProgressReply,
    ResultTicket,
    SqlReply,
    SqlRequest,
    StartSession,
    WorkerStatus,
    from_json,
    to_json,
)
from duckflock.exec.runtime import Runtime
from duckflock.transport.base import Inbox
from duckflock.transport.flight import FlightTransport
from duckflock.transport.flight_server import FlightServer
from duckflock.versions import engine_versions


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
    def _teardown(self, session: _Session | None) -> None:
        with self._lock:
            if session is None or self._session is not session:
                return
            self._session = None
            self.server.close_inbox(session.sid)
        if session.driver is not None:
            with contextlib.suppress(DuckflockError):
                session.driver.broadcast_stop()
        if session.runtime is not None:
            session.runtime.close()

    def _watchdog(self) -> None:
        while True:
            time.sleep(1.0)
            s = self._session
            idle = s is not None and s.running == 0 and time.monotonic() - s.last_call > self.idle_timeout_s
            if s is not None and s.rank == 0 and idle:
                self._teardown(s)

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
    def action(self, kind: str, body: bytes) -> bytes | Iterator[bytes]:
        if kind == "status":
            s = self._session
            return to_json(WorkerStatus(s.sid if s else None))
        if kind == "prepare":
            return to_json(self._prepare(from_json(PrepareSession, body)))
        if kind == "start":
            self._start(from_json(StartSession, body))
            return b"ok"
        if kind == "close":
            self._teardown(self._current(from_json(CloseRequest, body).session))
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
        if isinstance(request, SqlRequest) and request.progress:
            return self._answer_with_progress(s, request)
        return pickling.dumps(self._answer(s, request))

    def _answer(
        self,
        s: _Session,
        request: SqlRequest | PlanRequest,
        send_progress: Callable[[ProgressReply], None] | None = None,
    ) -> SqlReply | PlanReply | ErrorReply:
        assert s.driver is not None
        with self._lock:  # seen by a second caller's _prepare, which would tear the session down
            if self._session is not s:
                gone = f"no session {s.sid} here: another caller took over the workers"
                return ErrorReply(DuckflockError(gone))
            s.running += 1  # one query at a time per session (one driver)
        try:
            return s.driver.answer(request, lambda table: self._keep(s, table), send_progress)
        except TransportError as e:  # a peer is lost: this session cannot continue
            self._teardown(s)
            return ErrorReply(e)
        except DuckflockError as e:
            return ErrorReply(e)
        finally:
            s.running -= 1
            s.last_call = time.monotonic()

    def _answer_with_progress(self, s: _Session, request: SqlRequest) -> Iterator[bytes]:
        """The query's ProgressReply snapshots as they happen, then its reply: one streamed answer."""
        replies: queue.Queue = queue.Queue()

        def run() -> None:
            try:
                replies.put(self._answer(s, request, replies.put))
            except Exception as e:  # a bug: the stream still ends with a reply
                replies.put(ErrorReply(DuckflockError(f"internal error: {e}")))

        threading.Thread(target=run, name="duckflock-sql", daemon=True).start()
        while True:
            reply = replies.get()
            yield pickling.dumps(reply)
            if not isinstance(reply, ProgressReply):
                return

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
