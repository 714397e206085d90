"""``duckflock bench calibrate``: the machine constants the performance model (model.py) needs.

Each constant is one small measurement, the fastest of a few repeats (the machine may be busy; the
load average is recorded with them):

* ``memcpy_gbps``: copying a large array;
* ``mpi_gbps``, ``mpi_latency_s``: MPI point-to-point bandwidth of a 64 MiB message and half the
  round trip of an 8-byte one, between 2 ranks of a job launched like duckflock's;
* ``scan_values_s``, ``scan_string_gbps``: DuckDB on one thread reading a synthetic Parquet file,
  filtering and summing: fixed-width values per second, and string bytes per second;
* ``join_rows_s``, ``agg_rows_s``, ``sort_rows_s``: DuckDB on one thread, rows entering a hash join
  (build + probe, random keys, payload columns), a hash aggregate with many groups, a sort;
* ``arrow_gbps``: DuckDB on one thread producing Arrow (a stage's output, the query's result);
* ``ipc_gbps``: Arrow IPC encoding as the exchange does it (exchange/codec.py);
* ``partition_gbps``: splitting a batch by target rank with the exchange's own code
  (exchange/partition.py), for few (4) and many (64) targets;
* ``probe_s``: a fixed small DuckDB workload, timed with the rates (validation compares it with
  its time then, to tell how much busier the machine has become);
* ``overhead``: the fixed cost of a query: ``a + b * stages + c * ranks``, fitted by least squares
  to TPC-H queries at SF 0.01 (not the ones the model is validated on) on 1, 2 and 4 ranks.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from duckflock_bench.jobs import err, run_json_job, write_json
from duckflock_bench.measure import GB, load_average, machine_info, memcpy_gbps
from duckflock_bench.phases import summarize

REPEATS = 7  # the fastest of several: the one least slowed by other work on the machine
ROWS = 2_000_000
# Queries the overhead is fitted on: different from the validated ones (seed join, 3, 6, 9, 18).
OVERHEAD_QUERIES = (1, 5, 10, 12)


def _best_s(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    """The fastest of ``repeats`` timed calls: the one least disturbed by other work."""
    fn()  # warm: caches, allocator
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


PROBE_SQL = (
    "SELECT count(*), sum(s) FROM (SELECT i % 200000 AS g, sum(i) AS s FROM range(3000000) t(i) GROUP BY g)"
)


def probe_s() -> float:
    """A fixed small DuckDB workload on one thread (fastest of 3): how fast the machine is right
    now. The model's validation compares it with its value at calibration (a busy machine)."""
    con = duckdb.connect(config={"threads": 1})
    try:
        return _best_s(lambda: con.execute(PROBE_SQL).fetchall())
    finally:
        con.close()


def duckdb_rates(rows: int = ROWS) -> dict[str, float]:
    """Per-thread DuckDB rates on synthetic tables (one thread)."""
    con = duckdb.connect(config={"threads": 1})
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scan.parquet"
        con.execute(
            f"COPY (SELECT i AS a, hash(i) % 100000 * 0.01 AS b, (i % 1000)::INTEGER AS c, "
            f"'v' || hash(i) % 100000 AS s FROM range({rows}) t(i)) TO '{path}' (FORMAT parquet)"
        )
        numeric_q = f"SELECT sum(a), sum(b) FROM '{path}' WHERE c < 500"
        out["scan_values_s"] = 3 * rows / _best_s(lambda: con.execute(numeric_q).fetchall())
        string_bytes = con.execute(f"SELECT sum(strlen(s)) FROM '{path}'").fetchone()[0]  # type: ignore[index]
        string_q = f"SELECT sum(strlen(s)) FROM '{path}'"
        out["scan_string_gbps"] = string_bytes / _best_s(lambda: con.execute(string_q).fetchall()) / GB

    # Keys in random order and payload columns on both sides, as joins of real tables have.
    build = rows // 4
    con.execute(
        f"CREATE TABLE b AS SELECT hash(i) % {build * 4} AS k, i AS w, 'b' || (i % 5000) AS bs "
        f"FROM range({build}) t(i)"
    )
    con.execute(
        f"CREATE TABLE p AS SELECT hash(i * 3) % {build * 4} AS k, i AS v, i * 0.5 AS x, "
        f"(i % 97)::INTEGER AS g FROM range({rows}) t(i)"
    )
    join_q = "SELECT count(*), sum(v + w), max(bs), sum(x) FROM p JOIN b USING (k)"
    out["join_rows_s"] = (rows + build) / _best_s(lambda: con.execute(join_q).fetchall())
    # A group per 4 rows, as TPC-H's largest aggregates have (lineitem by order).
    agg_q = (
        "SELECT count(*), sum(sv) FROM (SELECT k // 2, sum(v) AS sv, count(*) AS n FROM p GROUP BY k // 2)"
    )
    out["agg_rows_s"] = rows / _best_s(lambda: con.execute(agg_q).fetchall())
    sort_rows = rows // 2
    sort_q = f"SELECT k, v, x FROM p WHERE v < {sort_rows} ORDER BY k, v"
    out["sort_rows_s"] = sort_rows / _best_s(lambda: con.sql(sort_q).fetch_arrow_table())
    con.execute("CREATE TABLE f AS SELECT p.*, 'p' || (v % 10000) AS s FROM p")
    nbytes = con.sql("SELECT * FROM f").fetch_arrow_table().nbytes
    out["arrow_gbps"] = nbytes / _best_s(lambda: con.sql("SELECT * FROM f").fetch_arrow_table()) / GB
    con.close()
    return out


def _batch(rows: int) -> pa.RecordBatch:
    rng = np.random.default_rng(7)
    ints = rng.integers(0, 1 << 40, rows)
    return pa.RecordBatch.from_pydict(
        {
            "k": ints,
            "x": rng.random(rows),
            "s": pa.array([f"v{i % 200000}" for i in range(rows)]),
        }
    )


def exchange_rates(rows: int = ROWS) -> dict[str, float]:
    """GB/s of the exchange's own IPC encoding and split-by-target code."""
    from duckflock.exchange.codec import encode, write_options
    from duckflock.exchange.partition import split_by_target

    batch = _batch(rows)
    nbytes = batch.nbytes
    options = write_options("none")
    out = {"ipc_gbps": nbytes / _best_s(lambda: encode(batch.schema, [batch], options)) / GB}
    rng = np.random.default_rng(11)
    for size in (4, 64):
        targets = pa.array(rng.integers(0, size, rows).astype(np.int32))
        with_target = pa.RecordBatch.from_arrays([*batch.columns, targets], [*batch.schema.names, "__t"])
        seconds = _best_s(lambda t=with_target, n=size: split_by_target(t, n))
        out[f"partition{size}_gbps"] = nbytes / seconds / GB
    return out


def mpi_rates(out: Path) -> dict[str, float]:
    """MPI bandwidth and latency between 2 ranks (a job of calibrate_job)."""
    _, job = run_json_job(2, "duckflock_bench.calibrate_job", ["--out", str(out)], out, timeout=120)
    return {"mpi_gbps": job["mpi_gbps"], "mpi_latency_s": job["mpi_latency_s"]}


def overhead_fit(data_root: str, ranks: tuple[int, ...] = (1, 2, 4), runs: int = 3) -> dict[str, float]:
    """Least-squares ``overhead = a + b * stages + c * ranks`` over small TPC-H queries at SF 0.01,
    the overhead as phases.py measures it (the query's time outside the driver's stages)."""
    import duckflock
    from duckflock.ingest.tpch import generate_tpch
    from duckflock.testing.tpch import query
    from duckflock_bench.model_bench import ONE_PER_PROCESS

    data = Path(data_root) / "tpch-sf0.01"
    generate_tpch(0.01, data, progress=False)
    rows: list[tuple[float, float, float]] = []
    for n in ranks:
        with duckflock.connect(str(data), ranks=n, config=ONE_PER_PROCESS) as db:
            for q in OVERHEAD_QUERIES:
                sql = query(q)
                db.sql(sql)
                overheads = []
                stages = 0
                for _ in range(runs):
                    r = db.sql(sql, profile=True)
                    overheads.append(summarize(r.stats, r.seconds)["overhead"])
                    stages = len(r.outcome.plan.stages)
                rows.append((float(stages), float(n), statistics.median(overheads)))
    a = np.array([[1.0, s, n] for s, n, _ in rows])
    y = np.array([t for _, _, t in rows])
    (fixed, per_stage, per_rank), *_ = np.linalg.lstsq(a, y, rcond=None)
    return {
        "overhead_s": max(0.0, float(fixed)),
        "overhead_per_stage_s": max(0.0, float(per_stage)),
        "overhead_per_rank_s": max(0.0, float(per_rank)),
    }


def calibrate(
    out: Path, data_root: str, rows: int = ROWS, ranks: tuple[int, ...] = (1, 2, 4)
) -> dict[str, object]:
    """Measure every constant; write and return ``out/constants.json``."""
    t0 = time.perf_counter()
    load = load_average()
    consts: dict[str, float] = {"memcpy_gbps": memcpy_gbps(128 << 20, repeats=3)}
    err.print("calibrate: DuckDB operator rates (1 thread)")
    consts["probe_s"] = probe_s()
    consts.update(duckdb_rates(rows))
    consts["probe_s"] = min(consts["probe_s"], probe_s())
    err.print("calibrate: IPC encoding and partitioning")
    consts.update(exchange_rates(rows))
    err.print("calibrate: MPI bandwidth and latency (2 ranks)")
    consts.update(mpi_rates(out / "mpi"))
    err.print(f"calibrate: per-query overhead (TPC-H SF 0.01, ranks {', '.join(map(str, ranks))})")
    consts.update(overhead_fit(data_root, ranks))
    result = {
        "constants": consts,
        "machine": machine_info(memcpy=False),
        "load_average_at_start": load,
        "load_average_at_end": load_average(),
        "wall_s": time.perf_counter() - t0,
    }
    write_json(out / "constants.json", result)
    return result
