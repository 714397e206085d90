"""``duckflock bench scaling``: parallel efficiency on this machine, measured honestly.

The baseline is DuckDB with one thread pinned to one core; duckflock runs N ranks, one per process,
each pinned to a core of its own with one DuckDB thread (Config.pin_cores), so N ranks have exactly
N cores. Speedup = DuckDB's time on one core / duckflock's on N; efficiency = speedup / N. Per
query: medians of interleaved runs (noise hits both), one profiled run's phases, and the result
checked against DuckDB's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import duckflock
from duckflock.ingest.tpch import generate_tpch
from duckflock.testing.compare import difference
from duckflock.testing.tables import oracle
from duckflock.testing.tpch import ORDER, queries
from duckflock_bench.jobs import err, write_json
from duckflock_bench.measure import machine_info, median, versions
from duckflock_bench.phases import summarize
from duckflock_bench.plots import bars_per_query
from duckflock_bench.report import print_markdown
from duckflock_bench.tpch_bench import interleaved


@contextlib.contextmanager
def one_core() -> Iterator[None]:
    """This process on its first usable core while the block runs (DuckDB's one thread runs on the
    calling thread: it has no workers)."""
    usable = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(usable)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, usable)


def run_scaling(sf: float, ranks: list[int], runs: int, data_root: str, only: list[int] | None) -> dict:
    usable = len(os.sched_getaffinity(0))
    too_many = [n for n in ranks if n > usable]
    if too_many:
        raise duckflock.DuckflockError(
            f"--ranks {too_many} needs more cores than the {usable} this process may use (a core each)"
        )
    data = Path(data_root) / f"tpch-sf{sf:g}"
    generate_tpch(sf, data, progress=True)
    qs = {n: q for n, q in queries().items() if not only or n in only}
    baseline = oracle(data, 1)
    results: dict = {"sf": sf, "runs": runs, "machine": machine_info(), "versions": versions(), "points": []}
    config = {"threads": 1, "pin_cores": True, "ranks_per_process": 1}
    for n_ranks in ranks:
        err.print(f"[bold]{n_ranks} ranks, a core each[/]")
        with duckflock.connect(str(data), ranks=n_ranks, config=config) as db:
            for n, q in qs.items():
                ours, theirs, got, want, profiled = interleaved(db, baseline, q, runs, one_core)
                problem = difference(got, want, ORDER.get(n))
                speedup = median(theirs) / median(ours)
                point = {
                    "ranks": n_ranks,
                    "query": n,
                    "duckflock_s": median(ours),
                    "duckdb_1core_s": median(theirs),
                    "speedup": speedup,
                    "efficiency": speedup / n_ranks,
                    "phases": summarize(profiled.stats, profiled.seconds),
                    "correct": problem is None,
                    "problem": problem,
                }
                results["points"].append(point)
                mark = " ok" if problem is None else f" WRONG: {problem}"
                err.print(
                    f"  Q{n:02d}: {point['duckflock_s']:.3f} s vs DuckDB on one core "
                    f"{point['duckdb_1core_s']:.3f} s: speedup {speedup:.2f}, efficiency "
                    f"{point['efficiency']:.2f}{mark}",
                    highlight=False,
                )
    return results


def scaling_markdown(results: dict) -> str:
    machine = results["machine"]
    lines = [
        f"# Parallel efficiency, TPC-H SF {results['sf']:g}",
        "",
        "Baseline: DuckDB, one thread pinned to one core. duckflock: N ranks in processes of their own, "
        f"each pinned to its own core with one DuckDB thread. Medians of {results['runs']} interleaved "
        f"runs. Machine: {machine.get('cores')} cores, load at start {machine.get('load_average_at_start')}.",
        "",
    ]
    for n_ranks in sorted({p["ranks"] for p in results["points"]}):
        pts = [p for p in results["points"] if p["ranks"] == n_ranks]
        ours, base = sum(p["duckflock_s"] for p in pts), sum(p["duckdb_1core_s"] for p in pts)
        lines += [
            f"## {n_ranks} ranks: {ours:.3f} s vs DuckDB on one core {base:.3f} s: speedup "
            f"{base / ours:.2f}, efficiency {base / ours / n_ranks:.2f}",
            "",
            "| query | duckflock s | DuckDB 1 core s | speedup | efficiency | compute | exchange | wait "
            "| correct |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
        ]
        for p in pts:
            ph, ok = p["phases"], "yes" if p["correct"] else "NO"
            lines.append(
                f"| Q{p['query']:02d} | {p['duckflock_s']:.3f} | {p['duckdb_1core_s']:.3f} "
                f"| {p['speedup']:.2f} | {p['efficiency']:.2f} | {ph.get('compute', 0):.3f} "
                f"| {ph.get('exchange', 0):.3f} | {ph.get('wait', 0):.3f} | {ok} |"
            )
        lines.append("")
    return "\n".join(lines)


def scaling_figure(results: dict, path: Path) -> None:
    title = f"TPC-H SF {results['sf']:g}: a core per rank vs DuckDB on one core"
    bars_per_query(results, "efficiency", "parallel efficiency (1 = linear)", title, path)


def run(sf: float, ranks: list[int], runs: int, data_root: str, out: Path, only: list[int] | None) -> int:
    results = run_scaling(sf, ranks, runs, data_root, only)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", results)
    md = scaling_markdown(results)
    (out / "results.md").write_text(md)
    scaling_figure(results, out / "scaling_efficiency.png")
    print_markdown(md)
    return 0 if all(p["correct"] for p in results["points"]) else 1
