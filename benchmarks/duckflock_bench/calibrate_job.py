"""The MPI part of ``bench calibrate``: ``mpiexec -n 2 python -m duckflock_bench.calibrate_job --out DIR``.

Rank 0 writes ``job.json`` with the point-to-point bandwidth and the per-message latency (half the
median round trip of an 8-byte message)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from duckflock_bench.mpi_measure import p2p_gbps, polite_barrier

PINGS = 2000


def latency_s(comm) -> float | None:
    rank = comm.Get_rank()
    if rank > 1:
        return None
    buf = np.zeros(8, dtype=np.uint8)
    times = []
    for _ in range(PINGS):
        if rank == 0:
            t0 = time.perf_counter()
            comm.Send(buf, dest=1, tag=3)
            comm.Recv(buf, source=1, tag=4)
            times.append((time.perf_counter() - t0) / 2)
        else:
            comm.Recv(buf, source=0, tag=3)
            comm.Send(buf, dest=0, tag=4)
    return statistics.median(times) if rank == 0 else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="duckflock_bench.calibrate_job")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    polite_barrier(comm)
    gbps = p2p_gbps(comm)
    polite_barrier(comm)
    lat = latency_s(comm)
    if comm.Get_rank() == 0:
        job = {"mpi_gbps": gbps, "mpi_latency_s": lat}
        (Path(args.out) / "job.json").write_text(json.dumps(job))
    polite_barrier(comm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
