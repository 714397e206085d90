"""``duckflock bench model --validate``: measured vs predicted time per phase.

For each rank count one warm session (as ``bench tpch``); per query a warm-up, then ``runs``
profiled runs; the fastest (the one least disturbed by other work on the machine) gives the
measured phases and the row and byte counts the model predicts from (model.py), with the constants
of ``bench calibrate``."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import duckflock
from duckflock.catalog.catalog import Catalog
from duckflock.errors import DuckflockError
from duckflock.exec.reports import StageStats
from duckflock.ingest.tpch import generate_tpch
from duckflock.testing.tpch import SEED_QUERY, query
from duckflock_bench.calibrate import probe_s
from duckflock_bench.jobs import err
from duckflock_bench.measure import cores, load_average
from duckflock_bench.model import Constants, counts_record, measure_counts, predict
from duckflock_bench.phases import final_stage_ids, summarize

# Each rank a process of its own, its exchanges over MPI, as ranks on different nodes would be (by
# default a session runs its ranks as threads of one process, whose stages may run once for all).
ONE_PER_PROCESS: dict[str, object] = {"ranks_per_process": 1}
COMPARED = ("overhead", "compute", "partition", "network", "final", "total")
TARGET = 0.25


def query_sql(name: str) -> str:
    """``seed`` or ``qN`` (TPC-H)."""
    if name == "seed":
        return SEED_QUERY
    if name.startswith("q") and name[1:].isdigit() and 1 <= int(name[1:]) <= 22:
        return query(int(name[1:]))
    raise DuckflockError(f"unknown query {name!r}: seed or q1 .. q22")


def measured_phases(stats: list[StageStats], total_s: float) -> dict[str, float]:
    """The measured counterparts of the model's phases (max over ranks of non-final stage sums)."""
    final = final_stage_ids(stats)
    part: dict[int, float] = defaultdict(float)
    net: dict[int, float] = defaultdict(float)
    for s in stats:
        if s.sid in final and s.rank == 0:
            continue
        part[s.rank] += s.exchange.partition_s + s.exchange.serialize_s
        net[s.rank] += s.exchange.send_wait_s
    ph = summarize(stats, total_s)
    return {
        "overhead": ph["overhead"],
        "compute": ph["compute"],
        "partition": max(part.values(), default=0.0),
        "network": max(net.values(), default=0.0),
        "wait": ph["wait"],
        "final": ph["final"],
        "total": total_s,
    }


def validate(
    consts: dict[str, float], sf: float, ranks: list[int], names: list[str], runs: int, data_root: str
) -> dict:
    data = Path(data_root) / f"tpch-sf{sf:g}"
    generate_tpch(sf, data, progress=False)
    catalog = Catalog.load(data)
    k = Constants.from_calibration(consts)
    n_cores = cores()
    points = []
    load_start = load_average()
    for n in ranks:
        with duckflock.connect(str(data), ranks=n, config=ONE_PER_PROCESS) as db:
            for name in names:
                sql = query_sql(name)
                db.sql(sql)
                before = probe_s()
                results = [db.sql(sql, profile=True) for _ in range(runs)]
                busy = min(before, probe_s()) / consts["probe_s"]
                r = min(results, key=lambda r: r.seconds)  # the run least disturbed by other work
                stages = list(r.outcome.plan.stages)
                table = r.outcome.table
                counts = measure_counts(stages, r.stats, catalog, n, (table.num_rows, table.nbytes))
                pred = predict(counts, k, n, n_cores, len(stages)).phases()
                meas = measured_phases(r.stats, r.seconds)
                err.print(
                    f"  {name} ranks={n}: measured {meas['total']:.3f} s, predicted {pred['total']:.3f} s "
                    f"({error(pred['total'], meas['total']):+.0%}; machine {busy:.2f}x as slow)",
                    highlight=False,
                )
                points.append(
                    {
                        "query": name,
                        "ranks": n,
                        "stages": len(stages),
                        "measured": meas,
                        "predicted": pred,
                        "busy": busy,
                        "runs_s": [x.seconds for x in results],
                        "counts": counts_record(counts),
                    }
                )
                del results, r
    return {
        "sf": sf,
        "ranks": ranks,
        "queries": names,
        "runs": runs,
        "cores": n_cores,
        "load_average": {"start": load_start, "end": load_average()},
        "points": points,
    }


def error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured > 0 else float("nan")


def validation_markdown(v: dict) -> str:
    """The table of measured vs predicted phases. ``busy``: how much slower the probe workload ran
    around the point than at calibration; "adjusted" is the prediction times that factor. The
    runs' spread (slowest / fastest of the same query) is the measurement's own noise."""
    load = v["load_average"]
    show = ("overhead", "compute", "partition", "network", "final")
    raw = [error(p["predicted"]["total"], p["measured"]["total"]) for p in v["points"]]
    adj = [error(p["predicted"]["total"] * p["busy"], p["measured"]["total"]) for p in v["points"]]
    lines = [
        f"## Validation: TPC-H SF {v['sf']:g}, {v['cores']} cores, fastest of {v['runs']} profiled runs",
        "",
        f"Load average {load['start']} at the start, {load['end']} at the end. Total within "
        f"±{TARGET:.0%}: {sum(abs(e) <= TARGET for e in raw)} of {len(raw)} points as predicted, "
        f"{sum(abs(e) <= TARGET for e in adj)} adjusted for the machine's speed at the time. Median "
        f"absolute error {statistics.median(map(abs, raw)):.0%}, "
        f"adjusted {statistics.median(map(abs, adj)):.0%}.",
        "",
        f"| query | ranks | measured s ({' / '.join(show)}) | predicted s (same) | total measured "
        "| total predicted | error | busy | error adjusted | runs' spread |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p, e, a in zip(v["points"], raw, adj, strict=True):
        m, q = p["measured"], p["predicted"]
        lines.append(
            f"| {p['query']} | {p['ranks']} | {' / '.join(f'{m[x]:.3f}' for x in show)} "
            f"| {' / '.join(f'{q[x]:.3f}' for x in show)} | {m['total']:.3f} | {q['total']:.3f} "
            f"| {e:+.0%} | {p['busy']:.2f}x | {a:+.0%} | {max(p['runs_s']) / min(p['runs_s']):.2f}x |"
        )
    return "\n".join(lines) + "\n"
