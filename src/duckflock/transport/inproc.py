"""In-process transport: n linked endpoints in one process, for fast tests of exchange logic."""

from __future__ import annotations

import queue

from duckflock.transport.base import SendHandle, Transport


class _Done(SendHandle):
    def done(self) -> bool:
        return True


class InProcTransport(Transport):
    name = "inproc"
    multipart = True

    def __init__(self, rank: int, mailboxes: list[queue.SimpleQueue]):
        self.rank = rank
        self.size = len(mailboxes)
        self._boxes = mailboxes

    @classmethod
    def group(cls, size: int) -> list[InProcTransport]:
        boxes: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(size)]
        return [cls(r, boxes) for r in range(size)]

    def isend(self, dest: int, tag: int, data) -> SendHandle:
        if isinstance(data, list):
            copy: object = [bytes(memoryview(d).cast("B")) for d in data]
        else:
            copy = bytes(memoryview(data).cast("B"))
        self._boxes[dest].put((self.rank, tag, copy))
        return _Done()

    def poll(self) -> list[tuple[int, int, object]]:
        out = []
        box = self._boxes[self.rank]
        while True:
            try:
                out.append(box.get_nowait())
            except queue.Empty:
                return out
