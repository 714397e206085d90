"""``duckflock bench flight`` and ``duckflock bench netem``: duckflock's Arrow Flight workers measured.

flight: Flight workers on loopback vs the same number of MPI ranks vs single-process DuckDB, per
    query (seed join, TPC-H Q3/Q5/Q9/Q18). All three systems are warm and alive at once; their runs
    are interleaved (in a rotating order) so that noise on this machine hits them alike. Every
    worker/rank gets its share of the cores (``threads = cores // n``); DuckDB gets all of them.
netem: Flight workers on "hosts" (network namespaces, ``duckflock.testing.netns``) whose links are shaped to a
    rate (and delay, where the kernel has sch_netem), for each wire compression: see ``netem_bench``.

This module holds the command line of both (``add_parser``, ``run``) and the flight comparison;
the workers are started by ``flight_workers``. Both write results.json, results.md and a PNG;
timings are reported, never judged. The exit code is non-zero only when a point failed or gave a
result that differs from DuckDB's.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from duckflock.errors import DuckflockError
from duckflock.testing.compare import same_result
from duckflock.testing.tables import oracle
from duckflock.testing.workers import FlightWorkers
from duckflock_bench.flight_common import (
    ORDER_BY,
    ensure_data,
    first_line,
    header,
    query_names,
    query_text,
    yes,
)
from duckflock_bench.jobs import err, write_json
from duckflock_bench.measure import cores, machine_info, median, parse_list, timed, versions
from duckflock_bench.netem_bench import netem_figure, netem_markdown, run_netem
from duckflock_bench.phases import summarize
from duckflock_bench.report import bytes_or_dash, print_markdown

FLIGHT_TARGET = 1.5  # the goal: Flight on loopback within 1.5x of MPI


def run(args: argparse.Namespace) -> int:
    if args.runs < 1:
        raise DuckflockError("--runs must be at least 1")
    if args.sf <= 0:
        raise DuckflockError(f"--sf must be positive, got {args.sf}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = query_names(args.queries)
    if args.bench == "flight":
        counts = parse_list(args.workers, int)
        if not counts or min(counts) < 1:
            raise DuckflockError(f"--workers needs positive counts, got {args.workers!r}")
        results = run_flight(args.sf, counts, args.runs, names, Path(args.data_root), out)
        md = flight_markdown(results)
        figure = flight_figure(results, out / "flight_vs_mpi.png")
    elif args.bench == "netem":
        from duckflock.testing.netns import NamespacesUnavailable

        compressions = [c.strip() for c in args.compression.split(",") if c.strip()]
        bad = [c for c in compressions if c not in ("none", "lz4", "zstd")]
        if bad or not compressions:
            raise DuckflockError(f"--compression takes none, lz4, zstd; got {args.compression!r}")
        rates = [r.strip() for r in args.rates.split(",") if r.strip()]
        try:
            results = run_netem(
                args.sf, args.hosts, rates, args.delay or None, compressions, args.runs, names,
                args.shared_storage, Path(args.data_root), out,
            )  # fmt: skip
        except NamespacesUnavailable as e:
            err.out(f"bench netem skipped: network namespaces are unavailable here: {e}")
            return 0
        md = netem_markdown(results)
        figure = netem_figure(results, out / "netem.png")
    else:
        raise DuckflockError(f"unknown benchmark {args.bench}")
    (out / "results.md").write_text(md)
    write_json(out / "results.json", results)
    print_markdown(md)
    err.out(f"wrote {out / 'results.json'}, {out / 'results.md'}, {figure}")
    points = results["points"]
    return 0 if points and not results["errors"] and all(p["correct"] for p in points) else 1


# ---- bench flight ----------------------------------------------------------------------------------
def run_flight(sf: float, counts: list[int], runs: int, names: list[str], data_root: Path, out: Path) -> dict:
    import duckflock

    data = ensure_data(data_root, sf)
    ncores = cores()
    results: dict = {
        "benchmark": "flight",
        "sf": sf,
        "data": str(data),
        "runs": runs,
        "queries": {q: query_text(q) for q in names},
        "machine": machine_info(memcpy=False),
        "versions": versions(with_mpi=False),  # mpi4py.MPI here would make this process an MPI singleton
        "target_flight_over_mpi": FLIGHT_TARGET,
        "points": [],
        "errors": [],
    }
    t_start = time.perf_counter()
    base = oracle(data, ncores)
    try:
        for n in counts:
            threads = max(1, ncores // n)
            config = {"threads": threads}
            err.out(f"bench flight: sf={sf:g}, {n} Flight workers and {n} MPI ranks, {threads} threads each")
            try:
                with contextlib.ExitStack() as stack:
                    workers = stack.enter_context(
                        FlightWorkers(data, [("127.0.0.1", [])] * n, out / f"workers{n}")
                    )
                    fdb = stack.enter_context(
                        duckflock.connect(workers=workers.addresses, token=workers.token, config=config)
                    )
                    mdb = stack.enter_context(duckflock.connect(str(data), ranks=n, config=config))
                    for name in names:
                        err.out(f"  {name}")
                        try:
                            point = _flight_point(name, fdb, mdb, base, runs)
                        except Exception as e:  # one failed query must not hide the others' numbers
                            results["errors"].append({"workers": n, "query": name, "error": first_line(e)})
                            err.out(f"  {name} failed: {first_line(e)}")
                            continue
                        results["points"].append({"workers": n, "threads": threads, **point})
                        write_json(out / "results.json", results)  # partial results survive a crash
            except Exception as e:
                results["errors"].append({"workers": n, "query": None, "error": first_line(e)})
                err.out(f"bench flight: {n} workers failed: {first_line(e)}")
    finally:
        base.close()
    results["wall_s"] = time.perf_counter() - t_start
    return results


def _flight_point(name: str, fdb, mdb, base, runs: int) -> dict:
    """One query: a warm-up of every system, ``runs`` interleaved timed runs, one profiled run each."""
    sql = query_text(name)
    order = ORDER_BY.get(name, [])
    systems: dict[str, Callable[[], pa.Table]] = {
        "flight": lambda: fdb.sql(sql).arrow(),
        "mpi": lambda: mdb.sql(sql).arrow(),
        "duckdb": lambda: base.sql(sql).to_arrow_table(),
    }
    expected = systems["duckdb"]()
    warm = {k: timed(fn) for k, fn in systems.items() if k != "duckdb"}
    correct = {k: [same_result(t, expected, order)] for k, (_, t) in warm.items()}
    times: dict[str, list[float]] = {k: [] for k in systems}
    keys = list(systems)
    for r in range(runs):
        for k in keys[r % 3 :] + keys[: r % 3]:  # rotate who goes first
            seconds, table = timed(systems[k])
            times[k].append(seconds)
            if k != "duckdb":
                correct[k].append(same_result(table, expected, order))
            del table
    profiles = {}
    for k, db in (("flight", fdb), ("mpi", mdb)):
        seconds, result = timed(lambda db=db: db.sql(sql, profile=True))
        correct[k].append(same_result(result.arrow(), expected, order))
        profiles[k] = summarize(result.stats, seconds)
    med = {k: median(v) for k, v in times.items()}
    return {
        "query": name,
        "rows": expected.num_rows,
        "flight_s": med["flight"],
        "mpi_s": med["mpi"],
        "duckdb_s": med["duckdb"],
        "flight_over_mpi": med["flight"] / med["mpi"],
        "mpi_over_duckdb": med["mpi"] / med["duckdb"],
        "flight_over_duckdb": med["flight"] / med["duckdb"],
        "bytes_exchanged_flight": profiles["flight"]["bytes_exchanged"],
        "bytes_exchanged_mpi": profiles["mpi"]["bytes_exchanged"],
        "phases_flight": profiles["flight"],
        "phases_mpi": profiles["mpi"],
        "warmup_s": {k: s for k, (s, _) in warm.items()},
        "runs_s": times,
        "flight_correct": all(correct["flight"]),
        "mpi_correct": all(correct["mpi"]),
        "correct": all(correct["flight"]) and all(correct["mpi"]),
    }


def flight_markdown(results: dict) -> str:
    lines = [f"# Flight workers on loopback vs MPI vs DuckDB (TPC-H SF {results['sf']:g})", ""]
    lines += [*header(results["machine"], results["versions"]), ""]
    lines += [
        f"Medians of {results['runs']} warm runs (1 warm-up each), systems interleaved per query in a "
        "rotating order. Flight: `duckflock worker` processes on 127.0.0.1, the caller in this process. "
        "MPI: `connect(data, ranks=n)` (a background mpiexec job). Both: `threads = cores // n` per "
        "worker/rank. DuckDB: one process, all cores, views over the same Parquet files. Times include "
        "delivering the result to the caller. Bytes: exchanged between workers/ranks in one extra "
        "profiled run (Arrow IPC payloads, not counting the result sent to the caller). "
        f"Target: Flight/MPI <= {results['target_flight_over_mpi']}.",
        "",
    ]
    for n in sorted({p["workers"] for p in results["points"]}):
        points = [p for p in results["points"] if p["workers"] == n]
        lines += [f"## {n} workers / ranks ({points[0]['threads']} DuckDB threads each)", ""]
        lines.append(
            "| query | rows | Flight s | MPI s | DuckDB s | Flight/MPI | MPI/DuckDB | bytes exchanged "
            "(Flight / MPI) | Flight = DuckDB | MPI = DuckDB |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|:---:|:---:|")
        for p in points:
            lines.append(
                f"| {p['query']} | {p['rows']:,} | {p['flight_s']:.3f} | {p['mpi_s']:.3f} "
                f"| {p['duckdb_s']:.3f} | {p['flight_over_mpi']:.2f}x | {p['mpi_over_duckdb']:.2f}x "
                f"| {bytes_or_dash(p['bytes_exchanged_flight'])} / {bytes_or_dash(p['bytes_exchanged_mpi'])} "
                f"| {yes(p['flight_correct'])} | {yes(p['mpi_correct'])} |"
            )
        met = sum(p["flight_over_mpi"] <= results["target_flight_over_mpi"] for p in points)
        lines += [
            "",
            f"Flight within {results['target_flight_over_mpi']}x of MPI: {met} of {len(points)}.",
            "",
        ]
    lines += _error_lines(results, "workers")
    return "\n".join(lines) + "\n"


def _error_lines(results: dict, key: str) -> list[str]:
    return [f"- failed: {key}={e.get(key)} query={e.get('query')}: {e['error']}" for e in results["errors"]]


def flight_figure(results: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({p["workers"] for p in results["points"]})
    fig, axes = plt.subplots(1, max(1, len(counts)), figsize=(5.5 * max(1, len(counts)), 4), squeeze=False)
    colors = {"flight": "#1f77b4", "mpi": "#ff7f0e", "duckdb": "#ffbf00"}
    for ax, n in zip(axes[0], counts, strict=False):
        points = [p for p in results["points"] if p["workers"] == n]
        width = 0.27
        for j, (k, label) in enumerate((("flight", "Flight"), ("mpi", "MPI"), ("duckdb", "DuckDB"))):
            xs = [i + (j - 1) * width for i in range(len(points))]
            ax.bar(xs, [p[f"{k}_s"] for p in points], width, color=colors[k], label=label)
        for i, p in enumerate(points):
            top = max(p["flight_s"], p["mpi_s"], p["duckdb_s"])
            ax.annotate(f"{p['flight_over_mpi']:.2f}x", (i, top), ha="center", va="bottom", fontsize=8,
                        xytext=(0, 3), textcoords="offset points")  # fmt: skip
        ax.set_xticks(range(len(points)), [p["query"] for p in points])
        ax.set_title(f"{n} workers / ranks")
        ax.set_ylabel("seconds (median)")
        ax.legend(fontsize=8)
    fig.suptitle(f"TPC-H SF {results['sf']:g}: Flight (loopback) vs MPI vs DuckDB; labels: Flight/MPI",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
