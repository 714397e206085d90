"""Reference measurements inside an MPI job, taken before the duckflock runtime starts."""

from __future__ import annotations

import statistics
import time

import numpy as np

from duckflock_bench.measure import GB


def polite_barrier(comm, sleep_s: float = 0.001) -> None:
    """A barrier that sleeps between tests instead of spinning (MPICH's Barrier busy-polls, which on
    an oversubscribed node steals the core of the rank being measured)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(sleep_s)


def p2p_gbps(comm, nbytes: int = 64 << 20, repeats: int = 5) -> float | None:
    """Median GB/s of one blocking Send/Recv of ``nbytes`` from rank 0 to rank 1 (rank 1 acks
    each with an empty message). Only ranks 0 and 1 take part; the result is known on rank 0."""
    rank = comm.Get_rank()
    if comm.Get_size() < 2 or rank > 1:
        return None
    buf = np.ones(nbytes, dtype=np.uint8) if rank == 0 else np.zeros(nbytes, dtype=np.uint8)
    ack = np.zeros(1, dtype=np.uint8)
    times = []
    for _ in range(repeats + 1):  # the first transfer sets up the channel: not timed
        if rank == 0:
            comm.Recv(ack, source=1, tag=7)  # rank 1 is ready
            t0 = time.perf_counter()
            comm.Send(buf, dest=1, tag=8)
            comm.Recv(ack, source=1, tag=9)
            times.append(time.perf_counter() - t0)
        else:
            comm.Send(ack, dest=0, tag=7)
            comm.Recv(buf, source=0, tag=8)
            comm.Send(ack, dest=0, tag=9)
    if rank != 0:
        return None
    return nbytes / statistics.median(times[1:]) / GB
