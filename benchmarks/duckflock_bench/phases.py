"""Turn one profiled query's per-rank, per-stage StageStats into a per-phase breakdown.

Phases of one run (seconds):

* ``overhead``: plan + dispatch: the query's wall time minus the driver's stage times (planning,
  sending the plan, collecting the profiles, casting the result);
* ``compute``: max over ranks of DuckDB's time in the non-final stages (scan, filter, join, ...);
* ``exchange``: max over ranks of partition + serialize + send wait in the non-final stages;
* ``wait``: max over ranks of the time spent waiting for and receiving exchange inputs (on the
  driver's final stage: collecting the other ranks' results);
* ``final``: the final stage on the driver, without its receive wait (e.g. the ORDER BY);
* ``total``: the query's wall time as the caller saw it.

The max-over-ranks phases may come from different ranks, so they need not add up to ``total``.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable

from duckflock.exec.reports import StageStats

PHASES = ("overhead", "compute", "exchange", "wait", "final")
EXCHANGE_PARTS = ("partition_s", "serialize_s", "send_wait_s", "recv_wait_s")


def final_stage_ids(stats: Iterable[StageStats]) -> set[int]:
    """Stages whose output goes to the user: the driver's last stage (highest id on rank 0)."""
    driver = [s.sid for s in stats if s.rank == 0]
    return {max(driver)} if driver else set()


def summarize(stats: list[StageStats], total_s: float) -> dict[str, float]:
    """The phases (see the module docstring), exchange detail and volume of one profiled run."""
    final = final_stage_ids(stats)
    compute: dict[int, float] = defaultdict(float)
    exchange: dict[int, float] = defaultdict(float)
    wait: dict[int, float] = defaultdict(float)
    parts: dict[str, dict[int, float]] = {p: defaultdict(float) for p in EXCHANGE_PARTS}
    final_s = 0.0
    driver_stage_s = 0.0
    for s in stats:
        e = s.exchange
        wait[s.rank] += e.recv_wait_s
        for p in EXCHANGE_PARTS:
            parts[p][s.rank] += getattr(e, p)
        if s.rank == 0:
            driver_stage_s += s.total_s
        if s.sid in final and s.rank == 0:
            final_s += s.total_s - e.recv_wait_s
            continue
        compute[s.rank] += s.compute_s
        exchange[s.rank] += e.partition_s + e.serialize_s + e.send_wait_s
    out = {
        "total": total_s,
        "overhead": max(0.0, total_s - driver_stage_s),
        "compute": max(compute.values(), default=0.0),
        "exchange": max(exchange.values(), default=0.0),
        "wait": max(wait.values(), default=0.0),
        "final": final_s,
        "bytes_exchanged": float(sum(s.exchange.bytes_out for s in stats)),
        "rows_exchanged": float(sum(s.exchange.rows_out for s in stats if s.sid not in final)),
    }
    for p in EXCHANGE_PARTS:
        out[f"max_{p}"] = max(parts[p].values(), default=0.0)
    return out


def stats_records(stats: list[StageStats]) -> list[dict[str, object]]:
    """Plain dicts (for JSON) of every rank's stage statistics."""
    return [dataclasses.asdict(s) for s in sorted(stats, key=lambda s: (s.rank, s.sid))]
