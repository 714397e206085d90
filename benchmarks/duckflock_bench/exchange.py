"""The exchange benchmark: all-to-all hash shuffle throughput through duckflock's exchange, compared
with memcpy and raw MPI point-to-point bandwidth measured in the same job."""

from __future__ import annotations

import time
from pathlib import Path

from duckflock_bench.jobs import JobFailed, err, run_json_job, write_json
from duckflock_bench.measure import GB, machine_info, median

PHASE_KEYS = ("max_partition_s", "max_serialize_s", "max_send_wait_s", "max_recv_wait_s")


def summarize_point(job: dict) -> dict[str, object]:
    runs = job["runs"]
    gbps = median([r["gbps"] for r in runs])
    memcpy = job["memcpy_gbps"]
    return {
        "ranks": job["ranks"],
        "input_gb": job["input_bytes"] / GB,
        "rows": job["rows"],
        "gbps_median": gbps,
        "gbps_runs": [r["gbps"] for r in runs],
        "wall_median_s": median([r["wall_s"] for r in runs]),
        "wire_gb": median([r["wire_bytes"] for r in runs]) / GB,
        "minor_faults_median": median([r["minor_faults"] for r in runs]),
        "phases_median_s": {k: median([r[k] for r in runs]) for k in PHASE_KEYS},
        "cpu_busy_median": median([r["cpu_busy"] for r in runs]),
        "split_only_gbps": job["split_only_gbps"],
        "memcpy_gbps": memcpy,
        "ratio_to_memcpy": gbps / memcpy if memcpy else float("nan"),
        "meets_half_memcpy": bool(memcpy) and gbps >= 0.5 * memcpy,
        "mpi_p2p_gbps": job["mpi_p2p_gbps"],
        "peak_rss_kb_per_rank": job["peak_kb_per_rank"],
        "peak_rss_kb_sum": sum(job["peak_kb_per_rank"]),
        "threads_per_rank": job["threads_per_rank"],
        "build_s": job["build_s"],
        "warmup_gbps": job["input_bytes"] / job["warmup_wall_s"] / GB,
        "correct": job["correct"],
    }


def run_exchange(
    ranks: list[int], gb: float, runs: int, out: Path, timeout: float = 1800
) -> dict[str, object]:
    results: dict[str, object] = {
        "benchmark": "exchange",
        "gb": gb,
        "runs": runs,
        "machine": machine_info(memcpy=False),
        "points": [],
        "jobs": [],
        "errors": [],
    }
    t_start = time.perf_counter()
    for n in ranks:
        point_dir = out / f"ranks{n}"
        err.print(f"exchange: ranks={n} gb={gb:g} runs={runs}")
        try:
            job_s, job = run_json_job(
                n,
                "duckflock_bench.exchange_job",
                ["--gb", str(gb), "--runs", str(runs), "--out", str(point_dir)],
                point_dir,
                timeout,
            )
        except (JobFailed, OSError, ValueError) as e:
            results["errors"].append({"ranks": n, "error": str(e)})  # type: ignore[union-attr]
            err.print(f"[red]exchange ranks={n} failed:[/] {e}", highlight=False)
            continue
        results.setdefault("versions", job["versions"])
        point = summarize_point(job)
        point["job_wall_s"] = job_s
        results["points"].append(point)  # type: ignore[union-attr]
        results["jobs"].append(job)  # type: ignore[union-attr]
    results["wall_s"] = time.perf_counter() - t_start
    write_json(out / "results.json", results)
    return results
