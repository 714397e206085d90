"""One MPI job of the seed benchmark: ``mpiexec -n N python -m duckflock_bench.seed_job ...``.

Rank 0 runs, on warm ranks, 1 warm-up and then ``--runs`` profiled runs of the seed query, and
interleaved with them (duckflock, DuckDB, duckflock, ...) the same query in a fresh single-process
DuckDB with all cores over the same Parquet files, while the other ranks wait idle (politely) in
``serve()``. Every result is compared with DuckDB's. Rank 0 writes ``job.json``; every rank writes
``rank-<r>.json`` with its peak memory when it leaves the SPMD block.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import duckflock
from duckflock.testing.compare import same_result
from duckflock.testing.tables import oracle
from duckflock.testing.tpch import SEED_ORDER, SEED_QUERY
from duckflock_bench.measure import cores, file_rss_kb, peak_rss_kb, versions
from duckflock_bench.phases import stats_records, summarize


def drive(db: duckflock.Session, data: str, runs: int, query: str = SEED_QUERY) -> dict[str, object]:
    """Rank 0's part: warm-up, then ``runs`` alternating duckflock / DuckDB runs, checked."""
    t0 = time.perf_counter()
    warm = db.sql(query, profile=True)
    warm_s = time.perf_counter() - t0
    # Measured before the in-process DuckDB baseline exists, so it is duckflock's alone.
    rank0_peak_kb = peak_rss_kb()
    rank0_file_kb = file_rss_kb()

    base = oracle(data, cores())
    t0 = time.perf_counter()
    expected = base.sql(query).to_arrow_table()
    base_warm_s = time.perf_counter() - t0
    correct = [same_result(warm.arrow(), expected, SEED_ORDER)]

    flock_runs: list[dict[str, object]] = []
    duckdb_s: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        result = db.sql(query, profile=True)
        total = time.perf_counter() - t0
        flock_runs.append({"phases": summarize(result.stats, total), "stats": stats_records(result.stats)})
        correct.append(same_result(result.arrow(), expected, SEED_ORDER))
        del result

        t0 = time.perf_counter()
        table = base.sql(query).to_arrow_table()
        duckdb_s.append(time.perf_counter() - t0)
        del table
    base.close()
    return {
        "ranks": db.ranks,
        "rows": expected.num_rows,
        "warmup_s": warm_s,
        "duckdb_warmup_s": base_warm_s,
        "duckflock_runs": flock_runs,
        "duckdb_s": duckdb_s,
        "duckdb_threads": cores(),
        "correct": all(correct),
        "correct_runs": correct,
        "rank0_peak_kb_after_warmup": rank0_peak_kb,
        "rank0_file_kb_after_warmup": rank0_file_kb,
        "versions": versions(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="duckflock_bench.seed_job")
    p.add_argument("--data", required=True)
    p.add_argument("--runs", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    job: dict[str, object] | None = None
    with duckflock.spmd(args.data) as db:
        if db is not None:
            job = drive(db, args.data, args.runs)
            (out / "job.json").write_text(json.dumps(job, indent=1, default=str))

    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    if job is None:
        peak, files = peak_rss_kb(), file_rss_kb()
    else:
        peak, files = int(job["rank0_peak_kb_after_warmup"]), int(job["rank0_file_kb_after_warmup"])  # type: ignore[arg-type]
    (out / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "peak_kb": peak, "file_kb": files}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
