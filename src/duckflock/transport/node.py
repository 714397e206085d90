"""Several ranks in one process: the in-process transport among them, MPI to the ranks of the
job's other processes.

A process hosts ``k`` ranks as threads (global rank = process * k + local index). They share one
interpreter and its libraries, which a rank process otherwise pays for alone: Python, NumPy,
Arrow, DuckDB and MPI hold tens of MB in every process before any query runs, the planner more on
rank 0. Messages between the process's own ranks are handed over in memory
(``InProcTransport``); those to other processes go over MPI.

MPI cannot tell threads apart: a probe on a shared communicator matches whichever thread's message
comes first, and two threads' multi-part messages to one process would interleave. So each pair of
local ranks (sender's index, receiver's index) has a communicator of its own: a receiving rank
probes only the ones addressed to it, and each keeps MPI's order of one sender's messages.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from duckflock.errors import TransportError
from duckflock.transport.base import Buffer, SendHandle, Transport
from duckflock.transport.inproc import InProcTransport

if TYPE_CHECKING:
    from duckflock.transport.mpi import MpiTransport


class NodeTransport(Transport):
    multipart = True

    def __init__(self, local: InProcTransport, process: int, processes: int, pairs: _Pairs | None):
        self.local, self.process, self.k = local, process, local.size
        self.rank = process * self.k + local.rank
        self.size = processes * self.k
        self.name = "mpi" if processes > 1 else "inproc"
        self._pairs = pairs

    @classmethod
    def group(cls, k: int) -> list[NodeTransport]:
        """This process's ``k`` ranks. Collective over MPI.COMM_WORLD where the job has more than
        one process: every process calls it with the same ``k``."""
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        processes, process = world.Get_size(), world.Get_rank()
        pairs = None
        if processes > 1:
            if k > 1 and MPI.Query_thread() < MPI.THREAD_MULTIPLE:
                raise TransportError("several ranks per process need an MPI with MPI_THREAD_MULTIPLE")
            pairs = _Pairs(k)
        return [cls(t, process, processes, pairs) for t in InProcTransport.group(k)]

    def isend(self, dest: int, tag: int, data: Buffer) -> SendHandle:
        process, index = divmod(dest, self.k)
        if process == self.process:
            return self.local.isend(index, tag, data)
        assert self._pairs is not None
        return self._pairs.mpi[self.local.rank][index].isend(process, tag, data)

    def poll(self) -> list[tuple[int, int, object]]:
        base = self.process * self.k
        done = [(base + src, tag, payload) for src, tag, payload in self.local.poll()]
        if self._pairs is not None:
            for sender, mpi in enumerate(self._pairs.to(self.local.rank)):
                done += [(src * self.k + sender, tag, payload) for src, tag, payload in mpi.poll()]
        return done

    def busy(self) -> bool:
        return self._pairs is not None and any(m.busy() for m in self._pairs.to(self.local.rank))

    def set_waker(self, wake: Callable[[], None]) -> bool:
        # In-process messages wake the multiplexer; MPI's are found only by polling.
        self.local.set_waker(wake)
        return self._pairs is None

    def close(self) -> None:
        if self._pairs is not None:
            self._pairs.release()


class _Pairs:
    """The MPI transports of every (sending index, receiving index) pair of local ranks, freed when
    the last of the process's ranks closes."""

    def __init__(self, k: int):
        from duckflock.transport.mpi import MpiTransport

        # Created in the same order on every process: each MpiTransport duplicates COMM_WORLD.
        self.mpi = [[MpiTransport() for _ in range(k)] for _ in range(k)]
        self._open = k
        self._lock = threading.Lock()

    def to(self, receiver: int) -> list[MpiTransport]:
        return [row[receiver] for row in self.mpi]

    def release(self) -> None:
        with self._lock:
            self._open -= 1
            last = self._open == 0
        if last:
            for row in self.mpi:
                for m in row:
                    m.close()
