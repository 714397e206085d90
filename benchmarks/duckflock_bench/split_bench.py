"""``duckflock bench split``: the sending side of a hash shuffle in one process, without the network.

Batches as a stage hands them over (``batch_rows`` rows, the target rank as the last column) are
split by target (several batches at a time, as the exchange writer does; ``--per-batch``: one at a
time), and each piece is encoded as it is split: as frames (MPI: the buffers themselves) and as one Arrow IPC
stream (Flight and the other transports). GB/s counts the input's bytes (without the target column)
over the time of split and encode together, against copying the same number of bytes with numpy in
the same run; by this thread's CPU time (robust to other work on the machine) and by the clock.
Medians of ``runs``.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from duckflock.config import Config
from duckflock.exchange.codec import encode, to_frames, write_options
from duckflock.exchange.partition import split_by_target
from duckflock_bench.measure import GB

# Each table's columns without the target; ``i`` is the row number.
WORKLOADS = {
    # The narrow-tuple join's rows: two BIGINTs.
    "narrow": "SELECT i * 7919 % {rows} AS k, i AS rid",
    # lineitem's columns and types, strings of its lengths, NULLs in a few columns.
    "lineitem": (
        "SELECT i // 4 AS l_orderkey, hash(i) % 200000 AS l_partkey, (hash(i) >> 20) % 10000 AS l_suppkey, "
        "(i % 7 + 1)::INTEGER AS l_linenumber, (i % 50 + 1)::DECIMAL(15,2) AS l_quantity, "
        "(i % 100000 / 3)::DECIMAL(15,2) AS l_extendedprice, "
        "CASE WHEN i % 13 = 0 THEN NULL ELSE (i % 11 / 100)::DECIMAL(15,2) END AS l_discount, "
        "(i % 9 / 100)::DECIMAL(15,2) AS l_tax, ['A','N','R'][i % 3 + 1] AS l_returnflag, "
        "['F','O'][i % 2 + 1] AS l_linestatus, DATE '1992-01-01' + (i % 2500)::INTEGER AS l_shipdate, "
        "CASE WHEN i % 17 = 0 THEN NULL ELSE DATE '1992-01-01' + (i % 2400)::INTEGER END AS l_commitdate, "
        "['DELIVER IN PERSON','COLLECT COD','NONE','TAKE BACK RETURN'][i % 4 + 1] AS l_shipinstruct, "
        "['AIR','MAIL','SHIP','TRUCK','RAIL','FOB','REG AIR'][i % 7 + 1] AS l_shipmode, "
        "CASE WHEN i % 29 = 0 THEN NULL "
        "ELSE repeat('carefully final ', (i % 3 + 1)::INTEGER) || i END AS l_comment"
    ),
}


def batches(workload: str, rows: int, targets: int, batch_rows: int) -> list[pa.RecordBatch]:
    """``rows`` rows in batches of ``batch_rows``, the last column a target spread by hash."""
    columns = WORKLOADS[workload].format(rows=rows).removeprefix("SELECT ")
    table = duckdb.sql(
        f"SELECT {columns}, (hash(i) % {targets})::USMALLINT AS __target "
        f"FROM (SELECT range AS i FROM range({rows}))"
    ).to_arrow_table()
    return table.combine_chunks().to_batches(max_chunksize=batch_rows)


def split(bs: list[pa.RecordBatch], size: int, group: int) -> Iterator[list[tuple[int, pa.RecordBatch]]]:
    """(target, piece) of each group of batches in turn: ``group`` bytes of batches at a time, as
    the exchange writer splits them (exchange/shuffle.py); one batch at a time where ``group`` is 0."""
    if not group:
        for b in bs:
            yield split_by_target(b, size)
        return
    from duckflock.exchange.partition import split_batches

    start, held = 0, 0
    for i, b in enumerate(bs):
        held += b.nbytes
        if held >= group or i == len(bs) - 1:
            yield [(t, piece) for t, piece, _ in split_batches(bs[start : i + 1], size)]
            start, held = i + 1, 0


def split_encode(bs: list[pa.RecordBatch], size: int, group: int, frames: bool) -> None:
    """Split, and encode each piece as a message of its own as soon as it is split (the writer
    sends larger messages: a chunk's worth of pieces, as to_frames and encode take them)."""
    schema = bs[0].schema.remove(bs[0].num_columns - 1)
    schema_bytes = schema.serialize().to_pybytes()
    options = write_options("none")
    for pieces in split(bs, size, group):
        for _, piece in pieces:
            to_frames(schema_bytes, [piece]) if frames else encode(schema, [piece], options)


def _drain(pieces: Iterator[object]) -> None:
    for _ in pieces:
        pass


def _medians(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """Median seconds of ``fn``: of the clock, and of this thread's CPU time (what the function
    itself spent, whatever else the machine runs)."""
    fn()  # warm-up: first-touch of the memory pool's pages
    wall, cpu = [], []
    for _ in range(runs):
        w0, c0 = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(wall), statistics.median(cpu)


def _memcpy(nbytes: int, runs: int) -> tuple[float, float]:
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    return _medians(lambda: np.copyto(dst, src), runs)


def _split_bytes(chunk_bytes: int, targets: int) -> int:
    from duckflock.exchange.shuffle import split_bytes  # here: --per-batch runs on older versions too

    return split_bytes(chunk_bytes, targets)


def _point(bs: list[pa.RecordBatch], size: int, group: int, runs: int) -> dict[str, float]:
    """GB/s of memcpy, split, split+frames and split+IPC, by the clock and by CPU time."""
    nbytes = sum(b.nbytes - 2 * b.num_rows for b in bs)  # without the target column
    timings = {
        "memcpy": _memcpy(nbytes, runs),
        "split": _medians(lambda: _drain(split(bs, size, group)), runs),
        "split_frames": _medians(lambda: split_encode(bs, size, group, True), runs),
        "split_ipc": _medians(lambda: split_encode(bs, size, group, False), runs),
    }
    point = {"mb": nbytes / 1e6}
    for name, (wall, cpu) in timings.items():
        point[f"{name}_gbps"] = nbytes / wall / GB
        point[f"{name}_cpu_gbps"] = nbytes / cpu / GB
    return point


def run_split(
    workloads: list[str], targets: list[int], mb: float, runs: int, per_batch: bool, out: Path
) -> dict:
    config = Config.from_env()
    points = []
    for workload in workloads:
        probe = batches(workload, 10_000, 2, 10_000)[0]
        rows = max(config.batch_rows, int(mb * 1e6 * probe.num_rows / probe.nbytes))
        for size in targets:
            bs = batches(workload, rows, size, config.batch_rows)
            group = 0 if per_batch else _split_bytes(config.chunk_bytes, size)
            points.append(
                {"workload": workload, "targets": size, "rows": rows, **_point(bs, size, group, runs)}
            )
    results = {
        "batch_rows": config.batch_rows,
        "per_batch": per_batch,
        "runs": runs,
        "load": os.getloadavg()[0],
        "points": points,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return results


_RATES = ("split", "split_frames", "split_ipc")


def split_markdown(results: dict) -> str:
    how = "split one batch at a time" if results["per_batch"] else "split as the exchange writer does"
    lines = [
        f"Batches of {results['batch_rows']:,} rows, {how}; medians of {results['runs']} runs, load "
        f"{results['load']:.1f}. GB/s of input by this thread's CPU time (by the clock in brackets); "
        "% of memcpy of the same bytes in the same run, by CPU time.",
        "",
        "| workload | targets | MB | memcpy GB/s | split GB/s | split+frames GB/s | split+IPC GB/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in results["points"]:
        m = p["memcpy_cpu_gbps"]
        cells = [
            f"{p[k + '_cpu_gbps']:.2f} ({p[k + '_gbps']:.2f}) {100 * p[k + '_cpu_gbps'] / m:.0f}%"
            for k in _RATES
        ]
        row = [
            p["workload"],
            str(p["targets"]),
            f"{p['mb']:.0f}",
            f"{m:.2f} ({p['memcpy_gbps']:.2f})",
            *cells,
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
