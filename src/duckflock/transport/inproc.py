"""In-process transport: n linked endpoints in one process (ranks that are threads of one process)."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from duckflock.transport.base import Buffer, Inbox, SendHandle, Transport


class _Done(SendHandle):
    def done(self) -> bool:
        return True


class InProcTransport(Transport):
    name = "inproc"
    multipart = True

    def __init__(self, rank: int, mailboxes: list[Inbox]):
        self.rank = rank
        self.size = len(mailboxes)
        self._boxes = mailboxes

    @classmethod
    def group(cls, size: int) -> list[InProcTransport]:
        boxes = [Inbox() for _ in range(size)]
        return [cls(r, boxes) for r in range(size)]

    def isend(self, dest: int, tag: int, data) -> SendHandle:
        payload = [_handed(d) for d in data] if isinstance(data, list) else _handed(data)
        self._boxes[dest].put((self.rank, tag, payload))
        return _Done()

    def poll(self) -> list[tuple[int, int, object]]:
        return self._boxes[self.rank].drain()

    def set_waker(self, wake: Callable[[], None]) -> bool:
        self._boxes[self.rank].wake = wake
        return True


def _handed(data: Buffer) -> Buffer:
    """What the receiver gets: Arrow buffers and bytes themselves, which the sender never changes
    once sent (the receiver's batches reference them, as they do a message a rank sends itself); a
    copy of anything else, which the sender may reuse. Copying every message would cost a memcpy per
    byte exchanged and a second copy of the messages waiting to be read."""
    return data if isinstance(data, (bytes, pa.Buffer)) else bytes(memoryview(data).cast("B"))
