"""The seed benchmark: the seed report's customer-orders join on 1..N ranks vs single-process DuckDB.

For each scale factor: generate TPC-H if missing, measure DuckDB's peak memory in a fresh process,
then run one MPI job per rank count (``seed_job``) and summarize its runs by median.
"""

from __future__ import annotations

import time
from pathlib import Path

from duckflock.ingest.tpch import generate_tpch
from duckflock.testing.tpch import SEED_QUERY
from duckflock_bench.baseline import duckdb_peak
from duckflock_bench.jobs import JobFailed, err, rank_memory_kb, run_json_job, write_json
from duckflock_bench.measure import machine_info, median
from duckflock_bench.phases import EXCHANGE_PARTS, PHASES

SUMMARY_KEYS = (*PHASES, "total", *(f"max_{p}" for p in EXCHANGE_PARTS))


def data_dir(data_root: str | Path, sf: float) -> Path:
    return Path(data_root) / f"tpch-sf{sf:g}"


def summarize_point(
    job: dict, peaks_kb: list[int], files_kb: list[int], duckdb_peak_kb: int
) -> dict[str, object]:
    """Medians over the timed runs of one (scale factor, rank count) point.

    Memory two ways: the sum of the ranks' peak RSS (each rank on a node of its own), and what the
    ranks take together on this one node, where the shared-library pages they all map are resident
    once: the sum of (peak - file-backed RSS) plus the largest file-backed RSS. File-backed RSS is
    read when the peak is (rank 0, after its warm-up) or at exit; it only grows, so this errs low
    by the few MB of library pages a rank touches after its peak."""
    runs = [r["phases"] for r in job["duckflock_runs"]]
    med = {k: median([r[k] for r in runs]) for k in SUMMARY_KEYS}
    flock_s = med["total"]
    duckdb_s = median(job["duckdb_s"])
    peak_sum = sum(peaks_kb)
    node = sum(p - f for p, f in zip(peaks_kb, files_kb, strict=True)) + max(files_kb, default=0)
    return {
        "ranks": job["ranks"],
        "rows": job["rows"],
        "duckflock_median_s": flock_s,
        "duckdb_median_s": duckdb_s,
        "ratio": flock_s / duckdb_s if duckdb_s > 0 else float("nan"),
        "phases_median_s": med,
        "bytes_exchanged": median([r["bytes_exchanged"] for r in runs]),
        "rows_exchanged": median([r["rows_exchanged"] for r in runs]),
        "peak_rss_kb_per_rank": peaks_kb,
        "peak_rss_kb_sum": peak_sum,
        "duckdb_peak_rss_kb": duckdb_peak_kb,
        "memory_ratio": peak_sum / duckdb_peak_kb if duckdb_peak_kb else float("nan"),
        "file_rss_kb_per_rank": files_kb,
        "node_memory_kb": node,
        "node_memory_ratio": node / duckdb_peak_kb if duckdb_peak_kb else float("nan"),
        "correct": job["correct"],
        "duckflock_s": [r["total"] for r in runs],
        "duckdb_s": job["duckdb_s"],
    }


def run_seed(
    sfs: list[float], ranks: list[int], runs: int, data_root: str, out: Path, timeout: float = 1800
) -> dict[str, object]:
    """Run every point and return the results (also written to ``out/results.json``)."""
    results: dict[str, object] = {
        "benchmark": "seed",
        "query": SEED_QUERY,
        "runs": runs,
        "machine": machine_info(memcpy=True),
        "scale_factors": [],
        "errors": [],
    }
    t_start = time.perf_counter()
    for sf in sfs:
        data = data_dir(data_root, sf)
        t0 = time.perf_counter()
        generate_tpch(sf, data, parts=12, progress=True)
        gen_s = time.perf_counter() - t0
        base_peak = duckdb_peak(data, SEED_QUERY)
        entry: dict[str, object] = {
            "sf": sf,
            "data": str(data),
            "datagen_or_check_s": gen_s,
            "duckdb_peak": base_peak,
            "points": [],
            "jobs": [],
        }
        results["scale_factors"].append(entry)  # type: ignore[union-attr]
        for n in ranks:
            point_dir = out / f"sf{sf:g}" / f"ranks{n}"
            err.print(f"seed: sf={sf:g} ranks={n} runs={runs}")
            try:
                job_s, job = run_json_job(
                    n,
                    "duckflock_bench.seed_job",
                    ["--data", str(data), "--runs", str(runs), "--out", str(point_dir)],
                    point_dir,
                    timeout,
                )
            except (JobFailed, OSError, ValueError) as e:
                results["errors"].append({"sf": sf, "ranks": n, "error": str(e)})  # type: ignore[union-attr]
                err.print(f"[red]seed sf={sf:g} ranks={n} failed:[/] {e}", highlight=False)
                continue
            results.setdefault("versions", job["versions"])
            point = summarize_point(job, *rank_memory_kb(point_dir, n), int(base_peak["peak_kb"]))
            point["job_wall_s"] = job_s
            entry["points"].append(point)  # type: ignore[union-attr]
            entry["jobs"].append({"ranks": n, **job})  # type: ignore[union-attr]
    results["wall_s"] = time.perf_counter() - t_start
    write_json(out / "results.json", results)
    return results
