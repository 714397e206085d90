"""MPI transport (mpi4py): Isend for sends, matched probe + Irecv for messages of any size.

Matched probes (``improbe``) make receiving safe while other threads also use MPI, and let us
allocate exactly the received size without a separate size message.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from duckflock.transport.base import SendHandle, Transport


class _MpiSend(SendHandle):
    __slots__ = ("_buf", "_req")

    def __init__(self, req: MPI.Request, buf: object):
        self._req = req
        self._buf = buf  # keep the payload alive until MPI is done with it

    def done(self) -> bool:
        if self._req.Test():
            self._buf = None
            return True
        return False


class MpiTransport(Transport):
    name = "mpi"

    def __init__(self, comm: MPI.Comm | None = None):
        self.comm = (comm or MPI.COMM_WORLD).Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._status = MPI.Status()
        self._pending: list[tuple[MPI.Request, int, int, np.ndarray]] = []

    def isend(self, dest: int, tag: int, data) -> SendHandle:
        view = memoryview(data).cast("B")
        return _MpiSend(self.comm.Isend([view, MPI.BYTE], dest=dest, tag=tag), data)

    def poll(self) -> list[tuple[int, int, object]]:
        while True:
            msg = self.comm.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, self._status)
            if msg is None:
                break
            buf = np.empty(self._status.Get_count(MPI.BYTE), dtype=np.uint8)
            req = msg.Irecv([buf, MPI.BYTE])
            self._pending.append((req, self._status.Get_source(), self._status.Get_tag(), buf))
        done = []
        if self._pending:
            still = []
            for req, src, tag, buf in self._pending:
                if req.Test():
                    done.append((src, tag, buf))
                else:
                    still.append((req, src, tag, buf))
            self._pending = still
        return done

    def busy(self) -> bool:
        return bool(self._pending)

    def close(self) -> None:
        self.comm.Free()
