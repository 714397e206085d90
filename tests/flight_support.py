"""Starting and stopping real `duckflock worker` processes for tests."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.flight as flight

from duckflock.testing.workers import FlightWorkers


def status(address: str, token: str) -> dict:
    """A worker's answer to ``status``: the session holding it, if any."""
    client = flight.FlightClient(f"grpc+tcp://{address}")
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())], timeout=10)
    return json.loads(
        next(iter(client.do_action(flight.Action("status", b""), options=options))).body.to_pybytes()
    )


class Workers(FlightWorkers):
    """``n`` workers on loopback (or on the given hosts, via a command prefix such as
    ``ip netns exec host1``), each on a port the OS picks; logs and the token file in ``tmp``."""

    def __init__(
        self,
        data: Path,
        n: int,
        tmp: Path,
        idle_timeout: float = 600.0,
        hosts: list[tuple[str, list[str]]] | None = None,
        extra: list[str] | None = None,
    ):
        hosts = hosts or [("127.0.0.1", [])] * n
        super().__init__(data, hosts[:n], tmp, idle_timeout=idle_timeout, extra=extra)
