"""A session on running ``duckflock worker`` processes over Arrow Flight. The first worker plans each
query and returns its result; the workers exchange data among themselves, never through this
process. The worker's side is ``exec.hosting.worker``.

A call to worker 0 is made by a thread of its own while the caller's thread waits, so the caller is
never stuck on a worker: beside the call a heartbeat goes to worker 0 every second (worker 0 knows
the caller is there; the caller, that worker 0 answers), and a cancel goes as a ``cancel`` call.
The session is closed, and the call raises, when worker 0 has answered nothing for
``peer_timeout_s`` or has not stopped a cancelled query within ``_CANCEL_GRACE_S``."""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import secrets
import threading
import time
from typing import TYPE_CHECKING

import pyarrow as pa

from duckflock.backends.base import expect_reply
from duckflock.config import Config
from duckflock.errors import DuckflockError, QueryCancelled, TransportError
from duckflock.exec.control.cancel import Cancel
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
    from_json,
    to_json,
)
from duckflock.exec.control.progress import Follow
from duckflock.exec.reports import ProgressCallback, QueryOutcome
from duckflock.exec.results.result_files import ResultWriter, is_directory
from duckflock.local_duckdb import local_time_zone
from duckflock.plan.stages import StagePlan
from duckflock.transport.flight_client import WorkerClient, WorkerUnresponsive
from duckflock.versions import SAME_EVERYWHERE, check_same

if TYPE_CHECKING:
    from duckflock.flightsql.parts import PartServing

_BEAT_S = 1.0  # worker 0 hears from the caller this often while a call runs
_POLL_S = 0.2  # how often the waiting caller looks at the heartbeats and a cancel
# How long a cancelled query's reply may take before the session is closed instead: the workers
# stop within a second; one that does not (frozen, or a bug) must not hold the caller.
_CANCEL_GRACE_S = 10.0
_CLOSE_S = 3.0  # how long closing waits for a worker (each answers at once; a frozen one never)


class FlightBackend:
    def __init__(self, workers: list[str], token: str, tls_root: bytes | None, config: dict[str, object]):
        scheme = "grpc+tls" if tls_root else "grpc+tcp"
        self.locations = [w if "://" in w else f"{scheme}://{w}" for w in workers]
        twice = sorted({w for w in self.locations if self.locations.count(w) > 1})
        if twice:  # one worker process serves one rank of a session
            raise DuckflockError(f"worker {', '.join(twice)} is listed more than once")
        self.ranks = len(self.locations)
        self.sid = secrets.token_hex(8)
        self.peer_timeout_s = Config.from_env(**config).peer_timeout_s
        self._closed = False
        self._ended: str | None = None  # why the session was closed under its caller
        self._clients = [WorkerClient(r, loc, token, tls_root) for r, loc in enumerate(self.locations)]
        # Workers' hosts may be set to other time zones: all answer in the caller's.
        zone = config.get("time_zone") or os.environ.get("DUCKFLOCK_TIME_ZONE") or local_time_zone()
        # Workers on other hosts read their own copies unless told the storage is shared
        # (docs/workers.md), as the CLI without --shared-data: assuming it, a worker read
        # partitions it does not hold (IO Error: No files found).
        config = {"shared_storage": False, **config, "time_zone": zone}
        self.time_zone = str(zone)
        try:  # every worker knows the session before any connects to its peers
            prepared = []
            for client in self._clients:
                prepare = PrepareSession(self.sid, client.rank, self.locations, config)
                prepared.append(_prepared(client, client.call("prepare", to_json(prepare))))
            check_same([p.versions for p in prepared], "worker")
            shares = [p.share_bytes for p in prepared]
            # Every worker builds a copy of a broadcast side: the smallest host bounds them.
            for client in self._clients:
                client.call("start", to_json(StartSession(self.sid, min(shares))))
        except DuckflockError:  # a transport's, or workers of different versions
            self.close()
            raise

    def _ask(
        self,
        kind: str,
        request: SqlRequest | PlanRequest,
        progress: ProgressCallback | None = None,
        cancel: Cancel | None = None,
    ) -> SqlReply | PlanReply:
        """Worker 0's reply, with the query's progress snapshots (streamed ahead of it) passed to
        ``progress``; ``cancel`` stops the query (QueryCancelled)."""
        if self._ended is not None:
            raise DuckflockError(self._ended)
        follow = Follow(progress)
        call = _Call(self._clients[0], kind, to_json(request), self.sid)
        cancel = cancel or Cancel()
        answered = False
        try:
            with cancel.hooked(call.cancel):
                reply = self._wait(call, follow)
            answered = True
        finally:
            call.end(wait=answered)  # a cancel on its way lands before the next call does
        if isinstance(reply, ErrorReply):
            raise reply.error
        follow.raise_error()
        return reply

    def _wait(self, call: _Call, follow: Follow) -> SqlReply | PlanReply | ErrorReply:
        where = f"worker 0 at {self.locations[0]}"
        while True:
            try:
                item = call.answers.get(timeout=_POLL_S)
            except queue.Empty:
                now = time.monotonic()
                if call.cancelled is not None and now - call.cancelled[1] > _CANCEL_GRACE_S:
                    self._end(f"{where} did not stop a cancelled query within {_CANCEL_GRACE_S:.0f} s")
                    raise QueryCancelled(f"{call.cancelled[0]}; {self._ended}") from None
                if now - call.answered > self.peer_timeout_s:
                    self._end(f"{where} answered nothing for {self.peer_timeout_s:.0f} s (frozen or cut off)")
                    raise TransportError(str(self._ended)) from None
                continue
            if isinstance(item, BaseException):
                raise item
            if item is None:
                raise TransportError(f"{where} ended the call without a reply")
            reply = pickle.loads(item)  # workers are trusted
            if not isinstance(reply, ProgressReply):
                return reply
            follow(reply.progress)

    def _end(self, why: str) -> None:
        """Close the session under its caller, who learns ``why`` now and at its next call. Worker 0,
        which does not answer, is not waited for."""
        self._ended = f"{why}, so the session was closed: connect again"
        self._close(self._clients[1:])
        self._clients[0].close()

    def run(
        self,
        query: str,
        profile: bool = False,
        progress: ProgressCallback | None = None,
        output: str | None = None,
        cancel: Cancel | None = None,
        serve_parts: PartServing | None = None,
    ) -> QueryOutcome:
        """An ``output`` file is written here, from the result as it streams in."""
        if output is not None and is_directory(output):
            # Parts would land on the workers' hosts, outside the data directory they confine to.
            raise DuckflockError("with workers, --output takes a file, not a directory")
        request = SqlRequest(
            query, profile, session=self.sid, progress=progress is not None, serve_parts=serve_parts
        )
        reply = self._ask("sql", request, progress, cancel)
        reply = expect_reply(SqlReply, reply, f"worker 0 at {self.locations[0]}")
        ticket = to_json(ResultTicket(self.sid, reply.rows))
        if output is None:
            reply.outcome.table = self._clients[0].fetch(ticket)
            return reply.outcome
        outcome = reply.outcome
        plan = outcome.plan
        writer = ResultWriter(output, plan.output_schema, plan.output_types, time_zone=self.time_zone)
        try:
            for batch in self._clients[0].stream_rows(ticket):
                writer.write(batch)
            writer.commit()
        except BaseException:
            writer.abort()
            raise
        outcome.table = pa.Table.from_batches([], outcome.plan.output_schema)
        outcome.rows_written = writer.rows
        return outcome

    def plan(self, query: str) -> StagePlan:
        reply = self._ask("plan", PlanRequest(query, session=self.sid))
        return expect_reply(PlanReply, reply, f"worker 0 at {self.locations[0]}").plan

    def close(self) -> None:
        self._close(self._clients)

    def _close(self, clients: list[WorkerClient]) -> None:
        """Every worker is told at once, each waited for at most ``_CLOSE_S``: a frozen worker
        never answers (the others end the session anyway once it is silent past peer_timeout_s)."""
        if self._closed:
            return
        self._closed = True
        body = to_json(CloseRequest(self.sid))
        threads = [threading.Thread(target=_close, args=(c, body), daemon=True) for c in clients]
        for t in threads:
            t.start()
        deadline = time.monotonic() + _CLOSE_S + 1.0
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))


class _Call:
    """One call to worker 0, made by a thread of its own that queues its answers (None after the
    last, or the exception it raised); beside it the heartbeats and, once cancelled, the cancel."""

    def __init__(self, client: WorkerClient, kind: str, body: bytes, sid: str):
        self.client = client
        self.sid = sid
        self.answers: queue.Queue[bytes | BaseException | None] = queue.Queue()
        self.answered = time.monotonic()  # when worker 0 last answered anything
        self.cancelled: tuple[str, float] | None = None  # the reason, and when
        self._done = threading.Event()
        self._sender: threading.Thread | None = None
        threading.Thread(target=self._call, args=(kind, body), name="duckflock-call", daemon=True).start()
        threading.Thread(target=self._beat, name="duckflock-beat", daemon=True).start()

    def _call(self, kind: str, body: bytes) -> None:
        try:
            for payload in self.client.stream(kind, body):
                self.answered = time.monotonic()
                self.answers.put(payload)
            self.answers.put(None)
        except BaseException as e:  # raised by the waiting thread
            self.answers.put(e)

    def _beat(self) -> None:
        body = to_json(Heartbeat(self.sid))
        while not self._done.wait(_BEAT_S):
            try:
                self.client.call("beat", body, timeout=5 * _BEAT_S)
            except WorkerUnresponsive:
                continue
            except TransportError:
                pass  # refused, yet answered (the session ended there: the call says why)
            self.answered = time.monotonic()

    def cancel(self, reason: str) -> None:
        """The cancel hook: returns at once, the request goes from a thread of its own."""
        self.cancelled = (reason, time.monotonic())
        body = to_json(CancelRequest(self.sid, reason))
        self._sender = threading.Thread(target=self._send, args=(body,), name="duckflock-cancel", daemon=True)
        self._sender.start()

    def _send(self, body: bytes) -> None:
        with contextlib.suppress(TransportError):
            self.client.call("cancel", body, timeout=_CANCEL_GRACE_S)

    def end(self, wait: bool) -> None:
        self._done.set()
        if wait and self._sender is not None:
            self._sender.join(_CLOSE_S)


def _close(client: WorkerClient, body: bytes) -> None:
    with contextlib.suppress(TransportError):
        client.call("close", body, timeout=_CLOSE_S)
    client.close()


def _prepared(client: WorkerClient, reply: bytes) -> Prepared:
    try:
        return from_json(Prepared, reply)
    except (ValueError, TypeError):  # an older worker answers in its own words
        raise DuckflockError(
            f"worker {client.rank} at {client.location} answered prepare as another duckflock version "
            f"does; {SAME_EVERYWHERE}"
        ) from None
