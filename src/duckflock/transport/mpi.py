"""MPI transport (mpi4py): Isend for sends, matched probe + Irecv for messages of any size.

Matched probes (``improbe``) make receiving safe while other threads also use MPI, and let us
allocate exactly the received size without a separate size message.

A multi-part message (a list of buffers) goes as one MPI message per buffer, so no buffer is copied
into a joint one. Its first message carries a flag bit in the tag and the part count; the parts
follow from the same sender in order (MPI does not let messages from one sender overtake each
other, and our probes match any tag), each received into its own allocation.
"""

from __future__ import annotations

import struct

import numpy as np
from mpi4py import MPI

from duckflock.errors import TransportError
from duckflock.transport.base import TAG_BITS, SendHandle, Transport

_MULTIPART = 1 << TAG_BITS


class _MpiSend(SendHandle):
    __slots__ = ("_bufs", "_reqs")

    def __init__(self, reqs: list[MPI.Request], bufs: object):
        self._reqs = reqs
        self._bufs = bufs  # keep the payload alive until MPI is done with it

    def done(self) -> bool:
        if MPI.Request.Testall(self._reqs):
            self._bufs = None
            return True
        return False


class _Incoming:
    """A message being received: its requests and buffers (one, or the parts of a multi-part one)."""

    __slots__ = ("parts", "reqs", "single", "src", "tag", "waiting")

    def __init__(self, src: int, tag: int, parts: int, single: bool):
        self.src, self.tag, self.single = src, tag, single
        self.waiting = parts  # parts not matched yet
        self.reqs: list[MPI.Request] = []
        self.parts: list[np.ndarray] = []

    def payload(self) -> object:
        return self.parts[0] if self.single else self.parts


class MpiTransport(Transport):
    name = "mpi"
    multipart = True

    def __init__(self, comm: MPI.Comm | None = None):
        self.comm = (comm or MPI.COMM_WORLD).Dup()
        tag_ub = self.comm.Get_attr(MPI.TAG_UB)
        if tag_ub is not None and tag_ub < (_MULTIPART << 1) - 1:
            raise TransportError(
                f"this MPI allows tags up to {tag_ub}; duckflock needs {(_MULTIPART << 1) - 1}"
            )
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._status = MPI.Status()
        self._pending: list[_Incoming] = []
        self._assembling: dict[int, _Incoming] = {}  # source -> multi-part message still matching parts

    def isend(self, dest: int, tag: int, data) -> SendHandle:
        if isinstance(data, list):
            head = struct.pack("<q", len(data) - 1) + bytes(memoryview(data[0]).cast("B"))
            reqs = [self.comm.Isend([head, MPI.BYTE], dest=dest, tag=tag | _MULTIPART)]
            reqs += [
                self.comm.Isend([memoryview(d).cast("B"), MPI.BYTE], dest=dest, tag=tag) for d in data[1:]
            ]
            return _MpiSend(reqs, (head, data))
        view = memoryview(data).cast("B")
        return _MpiSend([self.comm.Isend([view, MPI.BYTE], dest=dest, tag=tag)], data)

    def poll(self) -> list[tuple[int, int, object]]:
        while True:
            msg = self.comm.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, self._status)
            if msg is None:
                break
            src, tag = self._status.Get_source(), self._status.Get_tag()
            buf = np.empty(self._status.Get_count(MPI.BYTE), dtype=np.uint8)
            req = msg.Irecv([buf, MPI.BYTE])
            incoming = self._assembling.get(src)
            if incoming is None:
                incoming = _Incoming(src, tag & ~_MULTIPART, 1, single=not tag & _MULTIPART)
                self._pending.append(incoming)
            incoming.reqs.append(req)
            incoming.parts.append(buf)
            incoming.waiting -= 1
            if tag & _MULTIPART:
                req.Wait()  # a few bytes: the part count, then the caller's first frame
                incoming.waiting = int(struct.unpack_from("<q", bytes(buf[:8]))[0])
                incoming.parts[0] = buf[8:]
            if incoming.waiting:
                self._assembling[src] = incoming
            else:
                self._assembling.pop(src, None)
        done = []
        if self._pending:
            still = []
            blocked = set()  # sources with an earlier message still in progress: keep their order
            for incoming in self._pending:
                if incoming.src in blocked or incoming.waiting or not MPI.Request.Testall(incoming.reqs):
                    blocked.add(incoming.src)
                    still.append(incoming)
                else:
                    done.append((incoming.src, incoming.tag, incoming.payload()))
            self._pending = still
        return done

    def busy(self) -> bool:
        return bool(self._pending)

    def close(self) -> None:
        self.comm.Free()
