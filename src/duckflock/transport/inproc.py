"""In-process transport: n linked endpoints in one process, for fast tests of exchange logic."""

from __future__ import annotations

from collections.abc import Callable

from duckflock.transport.base import Inbox, SendHandle, Transport


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
        if isinstance(data, list):
            copy: object = [bytes(memoryview(d).cast("B")) for d in data]
        else:
            copy = bytes(memoryview(data).cast("B"))
        self._boxes[dest].put((self.rank, tag, copy))
        return _Done()

    def poll(self) -> list[tuple[int, int, object]]:
        return self._boxes[self.rank].drain()

    def set_waker(self, wake: Callable[[], None]) -> bool:
        self._boxes[self.rank].wake = wake
        return True
