"""Under mpiexec: every rank sends every other rank a mix of multi-part and single messages of
very different sizes (large ones go rendezvous, small ones eager, so they finish out of order) and
checks they arrive complete and in the order sent. Exit code 0 on success.

``mpi_order_job.py K``: K ranks per process (NodeTransport, all sending at once from threads);
without K, one MpiTransport per process."""

from __future__ import annotations

import sys
import threading
import time
import traceback

import numpy as np
from mpi4py import MPI

from duckflock.transport.base import Transport
from duckflock.transport.mpi import MpiTransport
from duckflock.transport.node import NodeTransport


def message(src: int, dest: int, i: int) -> object:
    """Message i from src to dest: its parts are filled with a value naming (src, dest, i, part)."""
    sizes = [3 << 20, 17, 0] if i % 3 == 0 else [1 + 5 * i]
    parts = [np.full(n, (src * 31 + dest * 7 + i * 3 + k) % 251, dtype=np.uint8) for k, n in enumerate(sizes)]
    return parts if len(parts) > 1 else parts[0]


def exchange(t: Transport) -> None:
    count = 40
    handles = [
        t.isend(d, 100 + i % 2, message(t.rank, d, i))
        for i in range(count)
        for d in range(t.size)
        if d != t.rank
    ]
    got: dict[int, list[tuple[int, object]]] = {s: [] for s in range(t.size) if s != t.rank}
    deadline = time.monotonic() + 60
    while sum(len(v) for v in got.values()) < count * (t.size - 1) or not all(h.done() for h in handles):
        for src, tag, payload in t.poll():
            got[src].append((tag, payload))
        assert time.monotonic() < deadline, f"rank {t.rank} timed out"
    for src, received in got.items():
        for i, (tag, payload) in enumerate(received):
            want = message(src, t.rank, i)
            assert tag == 100 + i % 2, (src, i, tag)
            if isinstance(want, list):
                assert isinstance(payload, list) and len(payload) == len(want), (src, i)
                for a, b in zip(payload, want, strict=True):
                    assert np.array_equal(_bytes(a), b), (src, i)
            else:
                assert np.array_equal(_bytes(payload), want), (src, i)


def _bytes(payload: object) -> np.ndarray:
    return np.frombuffer(memoryview(payload), dtype=np.uint8)  # type: ignore[arg-type]


def main() -> int:
    transports: list[Transport] = NodeTransport.group(int(sys.argv[1])) if sys.argv[1:] else [MpiTransport()]
    failed: list[str] = []

    def run(t: Transport) -> None:
        try:
            exchange(t)
        except BaseException:
            failed.append(traceback.format_exc())

    threads = [threading.Thread(target=run, args=(t,)) for t in transports]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    MPI.COMM_WORLD.Barrier()
    for t in transports:
        t.close()
    print("\n".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
