"""``duckflock bench split``: the sending side of a hash shuffle in one process, without the network.

Batches as a stage hands them over (``batch_rows`` rows, the target rank as the last column) are
split by target, and each target's pieces are encoded into one message, as the exchange writer does
when a target's buffer is full: as frames (MPI: the buffers themselves) and as one Arrow IPC
stream (Flight and the other transports). GB/s counts the input's bytes (without the target column)
over the time of split and encode together, against copying the same number of bytes with numpy in
the same run. Medians of ``runs``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import pyarrow as pa

from duckflock.config import Config
from duckflock.exchange.codec import encode, to_frames, write_options
from duckflock.exchange.partition import split_by_target
from duckflock_bench.measure import GB, memcpy_gbps

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


def split_encode(bs: list[pa.RecordBatch], size: int, frames: bool) -> None:
    """Split every batch; then one message per target holding all its pieces."""
    per_target: list[list[pa.RecordBatch]] = [[] for _ in range(size)]
    for b in bs:
        for t, piece in split_by_target(b, size):
            per_target[t].append(piece)
    schema = bs[0].schema.remove(bs[0].num_columns - 1)
    schema_bytes = schema.serialize().to_pybytes()
    options = write_options("none")
    for pieces in per_target:
        if pieces:
            to_frames(schema_bytes, pieces) if frames else encode(schema, pieces, options)


def _median_s(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm-up: first-touch of the memory pool's pages
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_split(
    workloads: list[str], targets: list[int], mb: float, runs: int, out: Path
) -> dict[str, list[dict]]:
    batch_rows = Config.from_env().batch_rows
    points = []
    for workload in workloads:
        probe = batches(workload, 10_000, 2, 10_000)[0]
        row_bytes = (probe.nbytes - 2 * probe.num_rows) / probe.num_rows
        rows = max(batch_rows, int(mb * 1e6 / row_bytes))
        for size in targets:
            bs = batches(workload, rows, size, batch_rows)
            nbytes = sum(b.nbytes - 2 * b.num_rows for b in bs)  # without the target column
            memcpy = memcpy_gbps(nbytes, repeats=runs)
            split_s = _median_s(lambda bs=bs, n=size: [split_by_target(b, n) for b in bs], runs)
            frames_s = _median_s(lambda bs=bs, n=size: split_encode(bs, n, frames=True), runs)
            ipc_s = _median_s(lambda bs=bs, n=size: split_encode(bs, n, frames=False), runs)
            point = {
                "workload": workload,
                "targets": size,
                "rows": rows,
                "batches": len(bs),
                "mb": nbytes / 1e6,
                "memcpy_gbps": memcpy,
                "split_gbps": nbytes / split_s / GB,
                "split_frames_gbps": nbytes / frames_s / GB,
                "split_ipc_gbps": nbytes / ipc_s / GB,
            }
            points.append(point)
            del bs
    results = {"batch_rows": batch_rows, "runs": runs, "points": points}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return results


_RATES = ("split_gbps", "split_frames_gbps", "split_ipc_gbps")


def split_markdown(results: dict) -> str:
    lines = [
        f"Split and encode, batches of {results['batch_rows']:,} rows, medians of {results['runs']} runs; "
        "% of memcpy of the same bytes in the same run.",
        "",
        "| workload | targets | MB | memcpy GB/s | split GB/s | split+frames GB/s | split+IPC GB/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in results["points"]:
        m = p["memcpy_gbps"]
        cells = [
            f"{p[k]:.2f} ({100 * p[k] / m:.0f}%)"
            for k in ("split_gbps", "split_frames_gbps", "split_ipc_gbps")
        ]
        lines.append(
            f"| {p['workload']} | {p['targets']} | {p['mb']:.0f} | {m:.2f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"
