"""The Arrow Flight transport on its own, in this process on loopback: the server half with a stand-in
handler, the caller's client, and two peers' transports linked through their servers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pyarrow as pa
import pytest

from duckflock.errors import DuckflockError, TransportError
from duckflock.exec.control.messages import PrepareSession, ResultTicket, SqlRequest, from_json, to_json
from duckflock.transport.flight import FlightTransport
from duckflock.transport.flight_client import WorkerClient, WorkerUnresponsive
from duckflock.transport.flight_server import FlightServer

TOKEN = "a-test-token-0123456789"


class Handler:
    """Echoes calls; refuses "refuse"; answers "wait" only once its caller has gone, which it
    notes; a ticket names a one-column table of that many rows."""

    def __init__(self) -> None:
        self.saw_caller_go = threading.Event()

    def action(self, kind: str, body: bytes, caller_gone: Callable[[], bool]) -> bytes | Iterator[bytes]:
        if kind == "refuse":
            raise DuckflockError("not here")
        if kind == "wait":
            return self._wait(caller_gone)
        return kind.encode() + b":" + body

    def _wait(self, caller_gone: Callable[[], bool]) -> Iterator[bytes]:
        deadline = time.monotonic() + 30
        while not caller_gone() and time.monotonic() < deadline:
            time.sleep(0.05)
        if caller_gone():
            self.saw_caller_go.set()
        yield b"late"

    def result(self, ticket: bytes) -> tuple[pa.Table, pa.ipc.IpcWriteOptions]:
        return pa.table({"x": list(range(int(ticket)))}), pa.ipc.IpcWriteOptions()


@pytest.fixture
def servers() -> Iterator[list[FlightServer]]:
    """Two workers' endpoints on ports the OS picks."""
    servers = [FlightServer("grpc+tcp://127.0.0.1:0", TOKEN, Handler()) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve, daemon=True).start()
    yield servers
    for s in servers:
        s.shutdown()


def _location(server: FlightServer) -> str:
    return f"grpc+tcp://127.0.0.1:{server.port}"


def test_calls_reach_the_handler_and_refusals_name_the_worker(servers):
    client = WorkerClient(1, _location(servers[0]), TOKEN, None)
    assert client.call("ping") == b"ok"
    assert client.call("sql", b"{}") == b"sql:{}"
    with pytest.raises(TransportError, match=r"worker 1 at grpc\+tcp://127.0.0.1:\d+: .*not here"):
        client.call("refuse")
    assert client.fetch(b"3").column("x").to_pylist() == [0, 1, 2]
    client.close()


def test_a_call_not_answered_in_time_names_the_worker_and_its_end_reaches_the_handler(servers):
    """A call's timeout ends it on both sides: the handler is told its caller has gone."""
    client = WorkerClient(0, _location(servers[0]), TOKEN, None)
    with pytest.raises(WorkerUnresponsive, match=r"worker 0 at grpc\+tcp://127.0.0.1:\d+"):
        client.call("wait", timeout=0.5)
    handler = servers[0].handler
    assert isinstance(handler, Handler) and handler.saw_caller_go.wait(10)
    client.close()


def test_a_wrong_token_is_refused(servers):
    client = WorkerClient(0, _location(servers[0]), "not-the-token-0123456789", None)
    with pytest.raises(TransportError, match="refused the token"):
        client.call("ping")
    client.close()


def test_peers_exchange_messages_through_their_servers(servers):
    peers = [_location(s) for s in servers]
    inboxes = [s.open_inbox("s1") for s in servers]
    ts = [FlightTransport("s1", r, peers, TOKEN, None, inboxes[r]) for r in range(2)]
    try:
        for i in range(3):
            ts[0].isend(1, 7 + i, b"hello %d" % i)
        got: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            got += [(src, tag, bytes(p)) for src, tag, p in ts[1].poll()]
            time.sleep(0.01)
        assert got == [(0, 7, b"hello 0"), (0, 8, b"hello 1"), (0, 9, b"hello 2")]
        assert ts[0].peer_failure() is None and ts[1].peer_failure() is None
    finally:
        for t in ts:
            t.close()


def test_a_closed_inbox_refuses_a_peer(servers):
    peers = [_location(s) for s in servers]
    inbox = servers[0].open_inbox("s2")
    servers[1].close_inbox("s2")  # never opened there: the session is not running on worker 1
    t = FlightTransport("s2", 0, peers, TOKEN, None, inbox)
    try:
        t.isend(1, 1, b"x")
        deadline = time.monotonic() + 10
        while t.peer_failure() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "worker 1" in (t.peer_failure() or "")
    finally:
        t.close()


def test_flight_requests_round_trip_as_json():
    for msg in (
        PrepareSession("abc", 1, ["grpc+tcp://h:1", "grpc+tcp://h:2"], {"threads": 2}),
        SqlRequest("SELECT 1", True, session="abc"),
        ResultTicket("abc", "k"),
    ):
        assert from_json(type(msg), to_json(msg)) == msg
