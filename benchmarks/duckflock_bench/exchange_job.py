"""One MPI job of the exchange benchmark: ``mpiexec -n N python -m duckflock_bench.exchange_job ...``.

1. Reference numbers, before duckflock starts: memcpy GB/s on rank 0 and raw MPI Send/Recv GB/s
   from rank 0 to rank 1, while the other ranks wait without spinning.
2. Every rank builds its share of ``--gb`` GB of Arrow data with DuckDB (BIGINT key, BIGINT,
   DOUBLE, short VARCHAR) plus the ``__target`` column ``hash(key) % size`` — untimed.
3. One untimed warm-up shuffle, then ``--runs`` timed all-to-all shuffles through the engine's own
   exchange: ExchangeWriter (split by target, Arrow IPC encode, mux sends with back-pressure,
   round-robin order) and read_exchange, on the runtime a query would use. Each run has its own
   query id and a barrier before and after. Each rank records its CPU time (main thread and whole
   process, which includes the mux thread and the kernel's MPI copies).
4. The split alone (``split_by_target`` over every rank's batches at once, no communication): the
   ceiling the shuffle cannot beat, measured under the same contention.
Rank 0 writes ``job.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import time
from pathlib import Path

import duckdb
import pyarrow as pa

from duckflock.config import Config
from duckflock.exchange.codec import write_options
from duckflock.exchange.kinds import ExchangeKind
from duckflock.exchange.partition import split_by_target
from duckflock.exchange.shuffle import ExchangeStats, ExchangeWriter, read_exchange
from duckflock.exec.resources.runtime import Runtime, mpi_runtimes
from duckflock_bench.measure import (
    GB,
    cores,
    machine_info,
    memcpy_gbps,
    peak_rss_kb,
    reset_peak_rss,
    versions,
)
from duckflock_bench.mpi_measure import p2p_gbps, polite_barrier

TARGET = "__target"


def data_sql(lo: int, hi: int, size: int) -> str:
    return (
        "SELECT k AS key, k * 7 AS b, CAST(k AS DOUBLE) / 3 AS c, 'v' || (k % 100000)::VARCHAR AS s, "
        f"CAST(hash(k) % {size} AS USMALLINT) AS {TARGET} FROM range({lo}, {hi}) t(k)"
    )


def data_bytes(batches: list[pa.RecordBatch]) -> int:
    """Bytes of the shuffled columns (everything but the target column)."""
    return sum(b.nbytes - b.column(b.num_columns - 1).nbytes for b in batches)


def build_share(
    con: duckdb.DuckDBPyConnection, rank: int, size: int, total_bytes: float, batch_rows: int
) -> tuple[list[pa.RecordBatch], pa.Schema, int]:
    """This rank's batches (keys [rank * rows, (rank + 1) * rows)), their schema and row count."""
    sample = con.sql(data_sql(0, 1 << 16, size)).to_arrow_table().to_batches()
    per_row = data_bytes(sample) / (1 << 16)
    rows = max(1, int(total_bytes / size / per_row))
    reader = con.sql(data_sql(rank * rows, (rank + 1) * rows, size)).to_arrow_reader(batch_rows)
    batches = [b for b in reader if b.num_rows]
    return batches, reader.schema, rows


def shuffle(rt: Runtime, qid: int, batches: list[pa.RecordBatch], schema: pa.Schema) -> tuple[pa.Table, dict]:
    """One timed all-to-all shuffle of this rank's batches; returns what this rank received."""
    everyone = list(range(rt.size))
    rt.mux.allgather(qid, None)  # barrier: everyone starts together
    rt.mux.finish(qid)
    stats = ExchangeStats()
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    main0 = time.thread_time()
    t0 = time.perf_counter()
    writer = ExchangeWriter(
        rt.mux,
        qid + 1,
        0,
        ExchangeKind.HASH,
        everyone,
        rt.config.chunk_bytes,
        write_options(rt.config.compression),
        stats,
    )
    for b in batches:
        writer.write(b)
    writer.close(schema)
    t_sent = time.perf_counter() - t0
    table = read_exchange(rt.mux, qid + 1, 0, everyone, stats)
    rt.mux.flush(qid + 1)
    wall = time.perf_counter() - t0
    main_cpu = time.thread_time() - main0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - usage0.ru_utime - usage0.ru_stime
    rt.mux.finish(qid + 1)
    rt.mux.allgather(qid + 2, None)  # barrier: everyone has finished
    rt.mux.finish(qid + 2)
    # Minor page faults: each is a first touch of fresh memory, costly on some VMs.
    return table, {
        "wall_s": wall,
        "send_side_s": t_sent,
        "minor_faults": usage.ru_minflt - usage0.ru_minflt,
        "main_cpu_s": main_cpu,
        "process_cpu_s": cpu,
        "sys_cpu_s": usage.ru_stime - usage0.ru_stime,
        **dataclasses.asdict(stats),
    }


def split_only_s(rt: Runtime, batches: list[pa.RecordBatch], repeats: int = 3) -> float:
    """Median seconds for this rank to split its batches by target, all ranks at once."""
    times = []
    for i in range(repeats):
        rt.mux.allgather(1000 + i, None)
        t0 = time.perf_counter()
        pieces = [split_by_target(b, rt.size) for b in batches]
        times.append(time.perf_counter() - t0)
        del pieces
    return statistics.median(times)


def check_received(rt: Runtime, table: pa.Table) -> tuple[int, int, int]:
    """(rows, rows that belong to another rank, sum of keys) of what this rank received."""
    rt.con.register("__received", table)
    try:
        bad, total = rt.con.execute(
            f"SELECT count(*) FILTER (WHERE hash(key) % {rt.size} <> {rt.rank}), "
            "coalesce(sum(key), 0)::VARCHAR FROM __received"
        ).fetchall()[0]
    finally:
        rt.con.unregister("__received")
    return table.num_rows, int(bad), int(total)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="duckflock_bench.exchange_job")
    p.add_argument("--gb", type=float, required=True)
    p.add_argument("--runs", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    memcpy = memcpy_gbps() if rank == 0 else None
    polite_barrier(comm)
    p2p = p2p_gbps(comm)
    polite_barrier(comm)
    peak_reset = reset_peak_rss()  # the peak below is the shuffle's, not the reference buffers'

    (rt,) = mpi_runtimes(None, Config.from_env())
    try:
        t0 = time.perf_counter()
        batches, schema, rows = build_share(rt.con, rank, size, args.gb * GB, rt.config.batch_rows)
        build_s = time.perf_counter() - t0
        my_bytes = data_bytes(batches)
        # One untimed warm-up shuffle: on a VM the first touch of fresh memory can cost more than
        # the shuffle itself; the timed runs measure the warm, steady state (like a warm query).
        table, warmup = shuffle(rt, 4, batches, schema)
        del table
        runs: list[dict] = []
        check = (0, 0, 0)
        for i in range(args.runs):
            table, stats = shuffle(rt, 10 + 3 * i, batches, schema)
            if i == args.runs - 1:
                check = check_received(rt, table)
            del table
            runs.append(stats)
        split_s = split_only_s(rt, batches)
        mine = {
            "rank": rank,
            "rows": rows,
            "batches": len(batches),
            "input_bytes": my_bytes,
            "build_s": build_s,
            "runs": runs,
            "warmup": warmup,
            "check": check,
            "split_only_s": split_s,
            "peak_kb": peak_rss_kb(),
            "peak_reset": peak_reset,
        }
        everyone = rt.mux.allgather(1, mine)
        if rank == 0:
            write_job(Path(args.out), everyone, size, args, memcpy, p2p, rt)
        rt.mux.allgather(2, None)
        rt.mux.flush(2)  # Mux.close does not wait for queued sends: a peer may still need them
    finally:
        rt.close()
    return 0


def write_job(out: Path, ranks: list, size: int, args, memcpy: float | None, p2p: float | None, rt) -> None:
    total_bytes = sum(r["input_bytes"] for r in ranks)
    total_rows = sum(r["rows"] for r in ranks)
    received = sum(r["check"][0] for r in ranks)
    misplaced = sum(r["check"][1] for r in ranks)
    key_sum = sum(r["check"][2] for r in ranks)
    runs = []
    for i in range(args.runs):
        per_rank = [r["runs"][i] for r in ranks]
        wall = max(s["wall_s"] for s in per_rank)
        runs.append(
            {
                "wall_s": wall,
                "gbps": total_bytes / wall / GB,
                # Share of the machine's cores the ranks kept busy (1.0 = every core all the time).
                "cpu_busy": sum(s["process_cpu_s"] for s in per_rank) / (wall * cores()),
                "wire_bytes": sum(s["bytes_out"] for s in per_rank),
                "minor_faults": sum(s["minor_faults"] for s in per_rank),
                **{
                    f"max_{k}": max(s[k] for s in per_rank)
                    for k in ("partition_s", "serialize_s", "send_wait_s", "recv_wait_s", "send_side_s")
                },
                "per_rank": per_rank,
            }
        )
    job = {
        "ranks": size,
        "gb_requested": args.gb,
        "input_bytes": total_bytes,
        "rows": total_rows,
        "correct": received == total_rows
        and misplaced == 0
        and key_sum == total_rows * (total_rows - 1) // 2,
        "memcpy_gbps": memcpy,
        "mpi_p2p_gbps": p2p,
        "config": dataclasses.asdict(rt.config),
        "threads_per_rank": rt.threads,
        "machine": machine_info(memcpy=False),
        "versions": versions(),
        "peak_kb_per_rank": [r["peak_kb"] for r in ranks],
        "peak_reset": all(r["peak_reset"] for r in ranks),
        "build_s": max(r["build_s"] for r in ranks),
        "split_only_gbps": total_bytes / max(r["split_only_s"] for r in ranks) / GB,
        "warmup_wall_s": max(r["warmup"]["wall_s"] for r in ranks),
        "runs": runs,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "job.json").write_text(json.dumps(job, indent=1, default=str))


if __name__ == "__main__":
    raise SystemExit(main())
