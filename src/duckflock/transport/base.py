"""The transport protocol: non-blocking point-to-point byte messages between ranks.

A transport moves opaque buffers tagged with an integer and delivers the messages of one source in
the order they were sent (ordered gathers rely on it). Collectives, routing, back-pressure and
error propagation live above it (``exchange.mux``), so MPI, Arrow Flight and the in-process
transport differ only here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

Buffer = Any  # anything exposing the buffer protocol (bytes, numpy arrays, Arrow buffers)

# Tags handed to a transport fit in this many bits; a transport may use the bits above for itself.
TAG_BITS = 28


class SendHandle(ABC):
    @abstractmethod
    def done(self) -> bool:
        """True once the buffer may be reused (the transport no longer needs it)."""


class Transport(ABC):
    rank: int
    size: int
    # For messages and profiles: "mpi", "flight", "inproc".
    name: str = "transport"
    # Whether isend takes a list of buffers (a multi-part message, delivered as a list) and sends
    # them without joining them into one.
    multipart: bool = False

    @abstractmethod
    def isend(self, dest: int, tag: int, data: Buffer) -> SendHandle:
        """Start sending ``data`` (a buffer, or a list of them if ``multipart``) to ``dest``;
        the caller keeps ``data`` alive until done()."""

    @abstractmethod
    def poll(self) -> list[tuple[int, int, Buffer]]:
        """Advance communication; return the messages that completed as (source, tag, payload)."""

    def busy(self) -> bool:
        """True while receives are in progress (they need polling to advance)."""
        return False

    def peer_failure(self) -> str | None:
        """A description of a lost peer, if the transport detected one."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


def view(payload: object) -> memoryview:
    """A bytes-like payload as a memoryview. Payloads are typed ``object`` because a transport also
    carries frame lists and in-process objects; this is where a bytes-like one is asserted."""
    return memoryview(payload)  # type: ignore[arg-type]  # Buffer protocol is not expressible in 3.11
