"""The transport protocol: non-blocking point-to-point byte messages between ranks.

A transport moves opaque buffers tagged with an integer and delivers the messages of one source in
the order they were sent (ordered gathers rely on it). Collectives, routing, back-pressure and
error propagation live above it (``exchange.mux``), so MPI, Arrow Flight and the in-process
transport differ only here.
"""

from __future__ import annotations

import queue
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

Buffer = Any  # anything exposing the buffer protocol (bytes, numpy arrays, Arrow buffers)

# Tags handed to a transport fit in this many bits; a transport may use the bits above for itself.
TAG_BITS = 28


class SendHandle(ABC):
    @abstractmethod
    def done(self) -> bool:
        """True once the transport no longer needs the buffer. A writable buffer may then be
        reused; ``bytes`` and Arrow buffers never are (ranks of one process hand them over as they
        are, and the receiver's batches keep referencing them)."""


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
        the caller keeps ``data`` alive until done() and never writes to ``bytes`` or Arrow buffers
        it has sent."""

    @abstractmethod
    def poll(self) -> list[tuple[int, int, Buffer]]:
        """Advance communication; return the messages that completed as (source, tag, payload)."""

    def busy(self) -> bool:
        """True while receives are in progress (they need polling to advance)."""
        return False

    def set_waker(self, wake: Callable[[], None]) -> bool:
        """Have ``wake`` called whenever a message arrives; False if this transport cannot tell
        (MPI: only polling finds a message), so its multiplexer must keep polling while idle."""
        return False

    def peer_failure(self) -> str | None:
        """A description of a lost peer, if the transport detected one."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class Inbox:
    """Messages that other threads deliver (in-process peers, a Flight server's handlers), which
    wake the receiving multiplexer: it need not poll for them."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.wake: Callable[[], None] = lambda: None

    def put(self, message: tuple[int, int, Buffer]) -> None:
        self._queue.put(message)
        self.wake()

    def drain(self) -> list[tuple[int, int, Buffer]]:
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out


def view(payload: object) -> memoryview:
    """A bytes-like payload as a memoryview. Payloads are typed ``object`` because a transport also
    carries frame lists and in-process objects; this is where a bytes-like one is asserted."""
    return memoryview(payload)  # type: ignore[arg-type]  # Buffer protocol is not expressible in 3.11
