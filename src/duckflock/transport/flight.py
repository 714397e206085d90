"""Arrow Flight transport: workers on ordinary hosts exchanging messages over gRPC.

Each worker runs a Flight server (``flight_server``) that puts its peers' messages into this
transport's inbox. A message to a peer is one record batch on a long-lived ``do_put`` stream from
this worker to that peer (``PeerStream`` names the session and the sender): a single large_binary
value holding the payload (already Arrow IPC from the exchange layer), with the tag in the batch's
app metadata. Callers talk to workers through ``flight_client``.
One sender thread per peer keeps the multiplexer thread free while a slow link drains.

Liveness: every worker sends a heartbeat to each peer every second on a stream of its own (so a big
message on a slow link does not hold heartbeats back); a peer that cannot be reached, or has been
silent for ``peer_timeout_s``, fails the session with a message naming it.
"""

from __future__ import annotations

import json
import queue
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from duckflock.transport.base import Inbox, SendHandle, Transport

HEARTBEAT_TAG = -1
HEARTBEAT_S = 1.0
_SCHEMA = pa.schema([pa.field("payload", pa.large_binary())])


@dataclass(frozen=True)
class PeerStream:
    """The descriptor of a do_put stream: which session's messages it carries, from which rank."""

    session: str
    src: int

    def command(self) -> flight.FlightDescriptor:
        return flight.FlightDescriptor.for_command(json.dumps(asdict(self)))

    @classmethod
    def from_command(cls, command: bytes) -> PeerStream:
        body = json.loads(command)
        return cls(str(body["session"]), int(body["src"]))


def wrap(payload) -> pa.RecordBatch:
    """One row holding the payload, without copying it."""
    buf = payload if isinstance(payload, pa.Buffer) else pa.py_buffer(payload)
    offsets = pa.py_buffer(np.array([0, buf.size], dtype=np.int64))
    return pa.RecordBatch.from_arrays(
        [pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, buf])], schema=_SCHEMA
    )


def unwrap(batch: pa.RecordBatch) -> pa.Buffer:
    col = batch.column(0)
    offsets = np.frombuffer(col.buffers()[1], dtype=np.int64, count=2, offset=8 * col.offset)
    return col.buffers()[2].slice(int(offsets[0]), int(offsets[1] - offsets[0]))


class CallAuth:
    """Client-side call options carrying the shared token."""

    def __init__(self, token: str, timeout: float | None = None):
        self.options = flight.FlightCallOptions(
            headers=[(b"authorization", f"Bearer {token}".encode())], timeout=timeout
        )


def client_for(location: str, tls_root: bytes | None) -> flight.FlightClient:
    kwargs = {"tls_root_certs": tls_root} if tls_root else {}
    return flight.FlightClient(location, **kwargs)


class _Sent(SendHandle):
    __slots__ = ("_done",)

    def __init__(self) -> None:
        self._done = threading.Event()

    def done(self) -> bool:
        return self._done.is_set()


class _Peer:
    """A do_put stream to one peer, fed by its own thread."""

    def __init__(self, transport: FlightTransport, dest: int):
        self.t = transport
        self.dest = dest
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name=f"duckflock-send-{dest}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        t = self.t
        writer = None
        try:
            client = client_for(t.peers[self.dest], t.tls_root)
            descriptor = PeerStream(t.session, t.rank).command()
            writer, _ = client.do_put(descriptor, _SCHEMA, options=t.auth.options)
            while True:
                item = self.queue.get()
                if item is None:
                    break
                tag, payload, handle = item
                writer.write_with_metadata(wrap(payload), pa.py_buffer(struct.pack("<q", tag)))
                if handle is not None:
                    handle._done.set()
            writer.done_writing()
            writer.close()
        except Exception as e:  # the peer is gone or refused us: fail the session, naming it
            t.failed = f"worker {self.dest} at {t.peers[self.dest]} is unreachable: {first_line(e)}"


def first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


class FlightTransport(Transport):
    name = "flight"

    def __init__(
        self,
        session: str,
        rank: int,
        peers: list[str],
        token: str,
        tls_root: bytes | None,
        inbox: Inbox,
        peer_timeout_s: float = 30.0,
    ):
        self.session = session
        self.rank = rank
        self.size = len(peers)
        self.peers = peers
        self.auth = CallAuth(token)
        self.tls_root = tls_root
        self.inbox = inbox  # filled by this worker's FlightServer with (src, tag, payload)
        self.timeout = peer_timeout_s
        self.failed: str | None = None
        now = time.monotonic()
        self.last_heard = dict.fromkeys(range(self.size), now)
        self._peers = {d: _Peer(self, d) for d in range(self.size) if d != rank}
        self._beats = {d: _Peer(self, d) for d in range(self.size) if d != rank}
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="duckflock-heartbeat", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            for peer in self._beats.values():
                peer.queue.put((HEARTBEAT_TAG, b"", None))

    def isend(self, dest: int, tag: int, data) -> SendHandle:
        handle = _Sent()
        self._peers[dest].queue.put((tag, data, handle))
        return handle

    def poll(self) -> list[tuple[int, int, object]]:
        out = []
        for src, tag, payload in self.inbox.drain():
            self.last_heard[src] = time.monotonic()
            if tag != HEARTBEAT_TAG:
                out.append((src, tag, payload))
        return out

    def set_waker(self, wake: Callable[[], None]) -> bool:
        self.inbox.wake = wake
        return True

    def peer_failure(self) -> str | None:
        if self.failed:
            return self.failed
        now = time.monotonic()
        for peer, heard in self.last_heard.items():
            if peer != self.rank and now - heard > self.timeout:
                return f"worker {peer} at {self.peers[peer]} sent nothing for {self.timeout:.0f} s"
        return None

    def close(self) -> None:
        self._stop.set()
        streams = [*self._peers.values(), *self._beats.values()]
        for peer in streams:
            peer.queue.put(None)
        for peer in streams:
            peer.thread.join(timeout=5)
