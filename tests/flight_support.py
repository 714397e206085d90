"""Starting and stopping real `duckflock worker` processes for tests."""

from __future__ import annotations

from pathlib import Path

from duckflock.testing.workers import FlightWorkers


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
