"""A duckflock worker: a Flight server that joins sessions, exchanges data with its peers and, as the
first worker of a session, plans queries and returns their results to the caller.

Session life cycle, driven by the caller (``session.FlightBackend``):
  prepare (every worker) -> start (every worker) -> sql / plan (worker 0) ... -> close.
A session ends on close, when a peer is lost, or after ``idle_timeout_s`` without a call from the
caller (so a caller that disappears does not leave workers holding memory).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import pickle
import queue
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow.flight as flight

from duckflock.catalog import Catalog
from duckflock.config import Config
from duckflock.errors import DuckflockError, TransportError
from duckflock.exchange.codec import write_options
from duckflock.exec.driver import Driver, serve
from duckflock.exec.progress import ProgressCallback
from duckflock.exec.runtime import Runtime
from duckflock.transport.flight import FlightTransport, unwrap


class TokenAuth(flight.ServerMiddlewareFactory):
    """Every call must carry ``authorization: Bearer <token>``."""

    def __init__(self, token: str):
        self.token = token.encode()

    def start_call(self, info, headers):
        values = headers.get("authorization") or headers.get("Authorization") or []
        given = (
            values[0].encode() if values and isinstance(values[0], str) else (values[0] if values else b"")
        )
        if not hmac.compare_digest(given, b"Bearer " + self.token):
            raise flight.FlightUnauthenticatedError("duckflock worker: invalid or missing token")
        return None


@dataclass
class _Session:
    sid: str
    rank: int
    peers: list[str]
    config: Config
    inbox: queue.Queue = field(default_factory=queue.Queue)
    runtime: Runtime | None = None
    driver: Driver | None = None
    results: dict = field(default_factory=dict)
    last_call: float = field(default_factory=time.monotonic)


class Worker(flight.FlightServerBase):
    def __init__(
        self,
        location: str,
        data: str,
        token: str,
        tls: tuple[bytes, bytes] | None = None,
        tls_root: bytes | None = None,
        idle_timeout_s: float = 600.0,
    ):
        kwargs = {"tls_certificates": [flight.CertKeyPair(cert=tls[0], key=tls[1])]} if tls else {}
        super().__init__(location, middleware={"auth": TokenAuth(token)}, **kwargs)
        self.data = str(Path(data).resolve())
        Catalog.load(self.data)  # refuse to start on a directory that is not a data directory
        self.token = token
        self.tls_root = tls_root or (tls[0] if tls else None)
        self.idle_timeout_s = idle_timeout_s
        self._lock = threading.RLock()
        self._session: _Session | None = None
        threading.Thread(target=self._watchdog, name="duckflock-watchdog", daemon=True).start()

    # ---- session management --------------------------------------------------------------------
    def _teardown(self, session: _Session | None) -> None:
        with self._lock:
            if session is None or self._session is not session:
                return
            self._session = None
        if session.driver is not None:
            with contextlib.suppress(DuckflockError):
                session.driver.broadcast_stop()
        if session.runtime is not None:
            session.runtime.close()

    def _watchdog(self) -> None:
        while True:
            time.sleep(1.0)
            s = self._session
            if s is not None and s.rank == 0 and time.monotonic() - s.last_call > self.idle_timeout_s:
                self._teardown(s)

    def _prepare(self, body: dict) -> None:
        self._teardown(self._session)
        config = replace(Config.from_env(**body.get("config", {})), restrict_to_data_dir=True)
        with self._lock:
            self._session = _Session(body["session"], body["rank"], body["peers"], config)

    def _start(self, body: dict) -> None:
        s = self._current(body["session"])
        transport = FlightTransport(
            s.sid, s.rank, s.peers, self.token, self.tls_root, s.inbox, s.config.peer_timeout_s
        )
        hosts = [p.rsplit(":", 1)[0] for p in s.peers]
        rt = Runtime.create(
            transport, Catalog.load(self.data), s.config, ranks_on_node=hosts.count(hosts[s.rank])
        )
        s.runtime = rt
        if s.rank == 0:
            s.driver = Driver(rt)
        else:
            threading.Thread(target=self._serve, args=(s,), name="duckflock-serve", daemon=True).start()

    def _serve(self, s: _Session) -> None:
        try:
            serve(s.runtime)
        except DuckflockError:
            pass  # a lost peer ends the session; the caller hears it from worker 0
        finally:
            self._teardown(s)

    def _current(self, sid: str) -> _Session:
        s = self._session
        if s is None or s.sid != sid:
            raise flight.FlightServerError(
                f"duckflock worker: no session {sid} here (it ended or never began)"
            )
        s.last_call = time.monotonic()
        return s

    # ---- Flight methods --------------------------------------------------------------------------
    def do_action(self, context, action):
        body = json.loads(action.body.to_pybytes() or b"{}")
        kind = action.type
        if kind == "ping":
            return [flight.Result(b"ok")]
        if kind == "status":  # whether a session holds this worker (and its memory)
            s = self._session
            return [flight.Result(json.dumps({"session": s.sid if s else None}).encode())]
        if kind == "prepare":
            self._prepare(body)
            return [flight.Result(b"ok")]
        if kind == "start":
            self._start(body)
            return [flight.Result(b"ok")]
        s = self._current(body["session"])
        if kind == "close":
            self._teardown(s)
            return [flight.Result(b"ok")]
        if s.driver is None:
            raise flight.FlightServerError("duckflock worker: queries go to the session's first worker")
        if kind == "sql" and body.get("progress"):
            return self._sql_with_progress(s, body)
        return [flight.Result(pickle.dumps(self._reply(s, kind, body)))]

    def _reply(self, s: _Session, kind: str, body: dict, progress: ProgressCallback | None = None) -> tuple:
        assert s.driver is not None
        try:
            if kind == "plan":
                reply = ("ok", s.driver.plan(body["query"]))
            elif kind == "sql":
                outcome = s.driver.run(body["query"], profile=body.get("profile", False), progress=progress)
                ticket = uuid.uuid4().hex
                s.results[ticket] = outcome.table
                outcome.table = None
                reply = ("ok", outcome, ticket)
            else:
                raise flight.FlightServerError(f"unknown action {kind}")
        except TransportError as e:  # a peer is lost: this session cannot continue
            self._teardown(s)
            reply = ("error", e)
        except DuckflockError as e:
            reply = ("error", e)
        return reply

    def _sql_with_progress(self, s: _Session, body: dict) -> Iterator[flight.Result]:
        """The sql reply streamed after the query's progress snapshots, as they happen."""
        replies: queue.Queue = queue.Queue()

        def run() -> None:
            try:
                replies.put(self._reply(s, "sql", body, lambda p: replies.put(("progress", p))))
            except Exception as e:  # a bug: the stream still ends with a reply
                replies.put(("error", DuckflockError(f"internal error: {e}")))

        threading.Thread(target=run, name="duckflock-sql", daemon=True).start()
        while True:
            reply = replies.get()
            yield flight.Result(pickle.dumps(reply))
            if reply[0] != "progress":
                return

    def do_get(self, context, ticket):
        sid, key = json.loads(ticket.ticket)
        s = self._current(sid)
        table = s.results.pop(key, None)
        if table is None:
            raise flight.FlightServerError("duckflock worker: unknown or already fetched result")
        # The result crosses the caller's link: compress it as the session's exchanges are.
        return flight.RecordBatchStream(table, options=write_options(s.config.compression))

    def do_put(self, context, descriptor, reader, writer):
        cmd = json.loads(descriptor.command)
        s = self._session
        if s is None or s.sid != cmd["session"]:
            raise flight.FlightServerError("duckflock worker: message for a session that is not running here")
        src = int(cmd["src"])
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return
            (tag,) = struct.unpack("<q", chunk.app_metadata.to_pybytes())
            s.inbox.put((src, tag, unwrap(chunk.data)))
