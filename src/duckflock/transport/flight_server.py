"""The server half of the Arrow Flight transport: the gRPC endpoint of one worker.

It does three things and knows nothing of queries:
  - ``do_put``: peers' message streams (``flight.PeerStream``), delivered as (source, tag, payload)
    into the inbox of the session they belong to, which that session's ``FlightTransport`` polls;
  - ``do_action``: control calls, answered by the handler (``ping`` is answered here: liveness),
    with one result or a stream of them (a query's progress snapshots, then its reply), told
    whether the caller is still there (the call's gRPC context);
  - ``do_get``: result rows, which the handler looks up by ticket.
Every call must carry the shared token (``TokenAuth``). ``exec.hosting.worker`` is the handler.
"""

from __future__ import annotations

import hmac
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

import pyarrow as pa
import pyarrow.flight as flight

from duckflock.errors import DuckflockError
from duckflock.transport.base import Inbox
from duckflock.transport.flight import PeerStream, unwrap


class FlightHandler(Protocol):
    """What a worker serves on its endpoint besides the peers' messages. A ``DuckflockError``
    refuses the call: the caller sees its message."""

    def action(self, kind: str, body: bytes, caller_gone: Callable[[], bool]) -> bytes | Iterator[bytes]:
        """The answer to a control call of type ``kind``: one result, or results as they come.
        ``caller_gone()`` tells, while they come, whether the caller has gone (its call cancelled,
        its connection lost)."""
        ...

    def result(self, ticket: bytes) -> tuple[pa.Table, pa.ipc.IpcWriteOptions]:
        """The rows ``ticket`` names, and how to encode them for the caller's link."""
        ...


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


class FlightServer(flight.FlightServerBase):
    def __init__(
        self,
        location: str,
        token: str,
        handler: FlightHandler,
        tls: tuple[bytes, bytes] | None = None,
    ):
        kwargs = {"tls_certificates": [flight.CertKeyPair(cert=tls[0], key=tls[1])]} if tls else {}
        super().__init__(location, middleware={"auth": TokenAuth(token)}, **kwargs)
        self.handler = handler
        self._lock = threading.Lock()
        self._inboxes: dict[str, Inbox] = {}

    def open_inbox(self, session: str) -> Inbox:
        """Accept peers' messages for ``session`` from now on, into the inbox returned."""
        with self._lock:
            return self._inboxes.setdefault(session, Inbox())

    def close_inbox(self, session: str) -> None:
        """Refuse further messages for ``session``."""
        with self._lock:
            self._inboxes.pop(session, None)

    def do_action(self, context, action):
        if action.type == "ping":
            return [flight.Result(b"ok")]
        try:
            answer = self.handler.action(action.type, action.body.to_pybytes(), context.is_cancelled)
        except DuckflockError as e:
            raise flight.FlightServerError(f"duckflock worker: {e}") from None
        if isinstance(answer, bytes):
            return [flight.Result(answer)]
        return _streamed(answer)

    def do_get(self, context, ticket):
        try:
            table, options = self.handler.result(ticket.ticket)
        except DuckflockError as e:
            raise flight.FlightServerError(f"duckflock worker: {e}") from None
        return flight.RecordBatchStream(table, options=options)

    def do_put(self, context, descriptor, reader, writer):
        stream = PeerStream.from_command(descriptor.command)
        with self._lock:
            inbox = self._inboxes.get(stream.session)
        if inbox is None:
            raise flight.FlightServerError("duckflock worker: message for a session that is not running here")
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return
            (tag,) = struct.unpack("<q", chunk.app_metadata.to_pybytes())
            inbox.put((stream.src, tag, unwrap(chunk.data)))


def _streamed(answers: Iterator[bytes]) -> Iterator[flight.Result]:
    """A handler's streamed answers as Flight results; a refusal midway ends the stream with it."""
    try:
        for body in answers:
            yield flight.Result(body)
    except DuckflockError as e:
        raise flight.FlightServerError(f"duckflock worker: {e}") from None
