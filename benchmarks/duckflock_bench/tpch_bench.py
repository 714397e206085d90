"""``duckflock bench tpch``: the 22 TPC-H queries on warm ranks vs single-process DuckDB, in one run.

For each rank count one session (a background MPI job) stays up; per query: a warm-up each, then
``runs`` timed runs alternating duckflock and DuckDB (so machine noise hits both), the medians, one
profiled run for the phase breakdown and bytes exchanged, and (``--check``) the comparison with
DuckDB's result. DuckDB runs in this process with every core while the ranks wait idle.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import duckdb
import pyarrow as pa

import duckflock
from duckflock.ingest.tpch import generate_tpch
from duckflock.session import Result, Session
from duckflock.testing.compare import difference
from duckflock.testing.tables import oracle
from duckflock.testing.tpch import ORDER, queries
from duckflock_bench.jobs import err, write_json
from duckflock_bench.measure import cores, machine_info, median, timed, versions
from duckflock_bench.phases import summarize
from duckflock_bench.plots import bars_per_query


class Interleaved(NamedTuple):
    ours: list[float]
    theirs: list[float]
    got: pa.Table  # duckflock's last result
    want: pa.Table  # DuckDB's
    profiled: Result


def interleaved(
    db: Session,
    baseline: duckdb.DuckDBPyConnection,
    q: str,
    runs: int,
    around: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> Interleaved:
    """A warm-up each (plan cache, file cache), then ``runs`` timed runs alternating duckflock and
    DuckDB (so machine noise hits both), and one profiled run. ``around``: the context DuckDB's
    calls run in."""
    db.sql(q)
    with around():
        want = baseline.sql(q).to_arrow_table()
    ours, theirs = [], []
    got = None
    for _ in range(max(1, runs)):
        s, got = timed(lambda: db.sql(q))
        ours.append(s)
        with around():
            theirs.append(timed(lambda: baseline.sql(q).to_arrow_table())[0])
    assert got is not None
    return Interleaved(ours, theirs, got.arrow(), want, db.sql(q, profile=True))


def run_tpch(
    sf: float, ranks: list[int], runs: int, check: bool, data_root: str, only: list[int] | None
) -> dict:
    data = Path(data_root) / f"tpch-sf{sf:g}"
    generate_tpch(sf, data, progress=True)
    qs = {n: q for n, q in queries().items() if not only or n in only}
    baseline = oracle(data, cores())
    results: dict = {"sf": sf, "runs": runs, "machine": machine_info(), "versions": versions(), "points": []}
    for n_ranks in ranks:
        err.print(f"[bold]{n_ranks} ranks[/]")
        with duckflock.connect(str(data), ranks=n_ranks) as db:
            for n, q in qs.items():
                ours, theirs, got, want, profiled = interleaved(db, baseline, q, runs)
                phases = summarize(profiled.stats, profiled.seconds)
                problem = difference(got, want, ORDER.get(n)) if check else None
                point = {
                    "ranks": n_ranks,
                    "query": n,
                    "duckflock_s": median(ours),
                    "duckdb_s": median(theirs),
                    "ratio": median(ours) / median(theirs),
                    "bytes_exchanged": phases.get("bytes_exchanged", 0),
                    "stages": len(profiled.outcome.plan.stages),
                    "phases": phases,
                    "correct": None if not check else problem is None,
                    "problem": problem,
                }
                results["points"].append(point)
                mark = "" if not check else (" ok" if problem is None else f" WRONG: {problem}")
                err.print(
                    f"  Q{n:02d}: {point['duckflock_s']:.3f} s vs DuckDB {point['duckdb_s']:.3f} s "
                    f"({point['ratio']:.2f}x){mark}",
                    highlight=False,
                )
    return results


def tpch_markdown(results: dict) -> str:
    machine = results["machine"]
    lines = [
        f"# TPC-H SF {results['sf']:g}: duckflock vs single-process DuckDB",
        "",
        f"Medians of {results['runs']} warm runs, interleaved with DuckDB (all cores, same files).",
        f"Machine: {machine.get('cores')} cores, memcpy {machine.get('memcpy_gbps', 0):.1f} GB/s. "
        "compute/exchange/wait: max over ranks, from one profiled run.",
        "",
    ]
    for n_ranks in sorted({p["ranks"] for p in results["points"]}):
        pts = [p for p in results["points"] if p["ranks"] == n_ranks]
        ours, theirs = sum(p["duckflock_s"] for p in pts), sum(p["duckdb_s"] for p in pts)
        lines += [
            f"## {n_ranks} ranks: sum {ours:.3f} s vs DuckDB {theirs:.3f} s = {ours / theirs:.2f}x",
            "",
            "| query | duckflock s | DuckDB s | ratio | stages | compute | exchange | wait | bytes exchanged "
            "| correct |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
        ]
        for p in pts:
            ph = p["phases"]
            ok = "-" if p["correct"] is None else ("yes" if p["correct"] else "NO")
            lines.append(
                f"| Q{p['query']:02d} | {p['duckflock_s']:.3f} | {p['duckdb_s']:.3f} | {p['ratio']:.2f}x "
                f"| {p['stages']} | {ph.get('compute', 0):.3f} | {ph.get('exchange', 0):.3f} "
                f"| {ph.get('wait', 0):.3f} "
                f"| {p['bytes_exchanged'] / 1e6:.1f} MB | {ok} |"
            )
        lines.append("")
    return "\n".join(lines)


def tpch_figure(results: dict, path: Path) -> None:
    title = f"TPC-H SF {results['sf']:g}"
    bars_per_query(results, "ratio", "time / single-process DuckDB", title, path)


def run(
    sf: float,
    ranks: list[int],
    runs: int,
    check: bool,
    data_root: str,
    out: Path,
    only: list[int] | None = None,
) -> int:
    results = run_tpch(sf, ranks, runs, check, data_root, only)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", results)
    md = tpch_markdown(results)
    (out / "results.md").write_text(md)
    tpch_figure(results, out / "tpch_ratio.png")
    from duckflock_bench.report import print_markdown

    print_markdown(md)
    return 0 if all(p["correct"] is not False for p in results["points"]) else 1
