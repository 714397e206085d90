"""``duckflock bench memory``: queries that need more memory than a node has, in a memory cgroup of
that size, next to single-process DuckDB in the same cgroup.

Each run is a fresh process tree (``duckflock sql --output`` for duckflock, a Python process for
DuckDB) in a fresh cgroup; reported per query and rank count: time, peak anonymous memory of the
whole tree (page cache excluded), peak bytes in the spill directory, OOM kills, and whether the
result equals DuckDB's (both written to Parquet and compared).

With ``--node-memory none`` there is no cgroup (and no need for root): the peak is the summed Pss
of the process tree, sampled (``pss.py``), which counts the shared-library pages the ranks share
once, as one node holds them; the ranks' own sum (the processes that load DuckDB, without mpiexec
and the launcher) is reported next to it, and each rank's own peak.
"""

from __future__ import annotations

import os
import sys
import tempfile
import textwrap
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pyarrow.parquet as pq

from duckflock.errors import DuckflockError
from duckflock.ingest.tpch import generate_tpch
from duckflock.testing.compare import difference
from duckflock.testing.tpch import ORDER, query
from duckflock_bench import pss
from duckflock_bench.cgroup import Measured, available, run_in_cgroup
from duckflock_bench.jobs import err, write_json
from duckflock_bench.measure import machine_info, median, versions

# The join (both comment columns travel), three TPC-H queries with large joins and
# aggregates, and a join where one key holds half of lineitem.
QUERIES = {
    "join": "SELECT count(*) AS n, max(l_comment || ps_comment) AS m FROM lineitem JOIN partsupp "
    "ON l_partkey = ps_partkey AND l_suppkey = ps_suppkey",
    "q9": query(9),
    "q18": query(18),
    "q21": query(21),
    "skew": "SELECT count(*) AS n, max(p_name || l_comment) AS m FROM lineitem JOIN part "
    "ON (CASE WHEN l_orderkey % 2 = 0 THEN 1 ELSE l_partkey END) = p_partkey",
}
_ORDER = {"q9": ORDER[9], "q18": ORDER[18], "q21": ORDER[21]}

_DUCKDB_SCRIPT = textwrap.dedent(
    """
    import sys
    import duckdb, pyarrow.parquet as pq
    from duckflock.sqltext import sql_literal
    from duckflock.testing.tables import oracle
    from duckflock_bench.measure import cores
    con = oracle(sys.argv[1], cores())
    con.execute("SET temp_directory = " + sql_literal(sys.argv[3]))
    pq.write_table(con.sql(open(sys.argv[2]).read()).to_arrow_table(), sys.argv[4])
    """
)


def parse_bytes(text: str) -> int | None:
    """'1.5GiB', '800MiB', '2GB', 'none' -> bytes (None for no limit)."""
    t = text.strip().lower()
    if t in ("none", "0", ""):
        return None
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    for unit, factor in units.items():
        if t.endswith(unit):
            return int(float(t[: -len(unit)]) * factor)
    return int(t)


def run_memory(
    sf: float, node_memory: str, ranks: list[int], runs: int, names: list[str], data_root: str, out: Path
) -> dict:
    limit = parse_bytes(node_memory)
    why = available() if limit is not None else pss.available()
    if why is not None:
        raise DuckflockError(f"bench memory {why}")
    unknown = [n for n in names if n not in QUERIES]
    if unknown:
        raise DuckflockError(f"unknown queries {unknown}; choose from {sorted(QUERIES)}")
    data = Path(data_root) / f"tpch-sf{sf:g}"
    generate_tpch(sf, data, progress=True)
    results: dict = {
        "sf": sf,
        "node_memory_bytes": limit,
        "meter": "cgroup anon" if limit is not None else "summed Pss",
        "runs": runs,
        "machine": machine_info(memcpy=False),
        "versions": versions(),
        "points": [],
    }
    for name in names:
        with tempfile.TemporaryDirectory(prefix="duckflock-membench-") as tmp:
            work = Path(tmp)
            qfile = work / "query.sql"
            qfile.write_text(QUERIES[name])
            want_path = work / "duckdb.parquet"
            got_paths = {n: work / f"duckflock-{n}.parquet" for n in ranks}
            calls: list[Callable[[], Measured | pss.Sampled]] = [
                partial(_duckdb, data, qfile, want_path, limit, work),
                *(partial(_duckflock, data, name, n, got_paths[n], limit, work) for n in ranks),
            ]
            base, *points = (_point(m) for m in _interleaved(runs, calls))
            want = pq.read_table(want_path) if base["ok"] else None
            results["points"].append({"query": name, "engine": "duckdb", "ranks": 1, **base})
            _say(name, "DuckDB", base)
            for n, point in zip(ranks, points, strict=True):
                got_path = got_paths[n]
                if point["ok"] and want is not None:
                    problem = difference(pq.read_table(got_path), want, _ORDER.get(name))
                    point["correct"], point["problem"] = problem is None, problem
                if base["ok"] and point["ok"]:
                    point["time_ratio"] = point["seconds"] / base["seconds"]
                    point["memory_ratio"] = point["peak_anon_bytes"] / max(base["peak_anon_bytes"], 1)
                    if "peak_rank_bytes" in point:
                        base_ranks = max(base["peak_rank_bytes"], 1)
                        point["rank_memory_ratio"] = point["peak_rank_bytes"] / base_ranks
                results["points"].append({"query": name, "engine": "duckflock", "ranks": n, **point})
                _say(name, f"{n} ranks", point)
    write_json(out / "results.json", results)
    return results


def _duckdb(data: Path, qfile: Path, result: Path, limit: int | None, work: Path) -> Measured | pss.Sampled:
    spill = work / "spill-duckdb"
    spill.mkdir(exist_ok=True)
    cmd = [sys.executable, "-c", _DUCKDB_SCRIPT, str(data), str(qfile), str(spill), str(result)]
    return _run(cmd, limit, spill, os.environ.copy())


def _duckflock(
    data: Path, name: str, ranks: int, result: Path, limit: int | None, work: Path
) -> Measured | pss.Sampled:
    spill = work / "spill-duckflock"
    spill.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "duckflock.cli.main", "sql", "--data", str(data), "--ranks", str(ranks)]
    cmd += ["--output", str(result), QUERIES[name]]
    env = {**os.environ, "DUCKFLOCK_TEMP_DIR": str(spill)}
    return _run(cmd, limit, spill, env)


def _run(cmd: list[str], limit: int | None, spill: Path, env: dict[str, str]) -> Measured | pss.Sampled:
    """In a cgroup of ``limit`` bytes; without a limit, no cgroup: the tree's Pss is sampled."""
    if limit is None:
        return pss.run_sampled(cmd, spill, env, timeout=900)
    return run_in_cgroup(cmd, limit, spill, env, timeout=900)


def _interleaved(runs: int, calls: list[Callable[[], Measured | pss.Sampled]]) -> list[list]:
    """``runs`` runs of each call, taking turns (DuckDB, then duckflock on each rank count, again):
    a machine that slows down or speeds up during a series shifts every engine's times alike, not
    the ones measured last. A failed run ends that call's series."""
    measured: list[list[Measured | pss.Sampled]] = [[] for _ in calls]
    for _ in range(runs):
        for call, done in zip(calls, measured, strict=True):
            if not done or done[-1].returncode == 0:
                done.append(call())
    return measured


def _point(measured: list[Measured | pss.Sampled]) -> dict:
    """Medians over the runs (peaks: the median run's)."""
    last = measured[-1]
    ok = last.returncode == 0
    point = {
        "ok": ok,
        "seconds": median([m.seconds for m in measured]),
        "peak_spill_bytes": max(m.peak_spill_bytes for m in measured),
        "error": None if ok else (last.stderr.strip().splitlines() or [f"exit code {last.returncode}"])[-1],
    }
    sampled = [m for m in measured if isinstance(m, pss.Sampled)]
    if sampled:
        # Pss: the whole tree in the "peak" column, the ranks alone and each rank's own peak beside.
        point["peak_anon_bytes"] = int(median([m.peak_pss_bytes for m in sampled]))
        point["peak_rank_bytes"] = int(median([m.peak_rank_pss_bytes for m in sampled]))
        point["peak_per_rank_bytes"] = [sorted(m.peak_by_pid.values(), reverse=True) for m in sampled]
        point["oom_kills"] = 0
    else:
        cg = [m for m in measured if isinstance(m, Measured)]
        point["peak_anon_bytes"] = max(m.peak_anon_bytes for m in cg)
        point["oom_kills"] = sum(m.oom_kills for m in cg)
    return point


def _say(name: str, who: str, p: dict) -> None:
    if not p["ok"]:
        err.print(f"  {name:5} {who:9} FAILED ({p['oom_kills']} OOM kills): {p['error']}", highlight=False)
        return
    extra = ""
    if "peak_rank_bytes" in p:
        extra = f"  ranks {p['peak_rank_bytes'] / 2**20:5.0f} MiB"
    if "time_ratio" in p:
        extra += f"  {p['time_ratio']:.2f}x time, {p['memory_ratio']:.2f}x memory"
    if "rank_memory_ratio" in p:
        extra += f" ({p['rank_memory_ratio']:.2f}x ranks only)"
    if p.get("correct") is False:
        extra += f"  WRONG: {p['problem']}"
    err.print(
        f"  {name:5} {who:9} {p['seconds']:7.2f} s  peak {p['peak_anon_bytes'] / 2**20:7.0f} MiB  "
        f"spill {p['peak_spill_bytes'] / 2**20:6.0f} MiB{extra}",
        highlight=False,
    )


def memory_markdown(results: dict) -> str:
    limit = results["node_memory_bytes"]
    node = f"{limit / 2**30:.2f} GiB cgroup" if limit else "no memory limit, no cgroup"
    if limit:
        meter = "Peak: anonymous memory of the whole process tree (page cache excluded), sampled every 50 ms."
    else:
        meter = (
            "Peak: summed Pss of the whole process tree at its peak instant (pages the processes "
            "share, such as libraries, counted once), sampled every 20 ms; ranks: the processes "
            "that load DuckDB only (no mpiexec, launcher or guards)."
        )
    lines = [
        f"# Memory: TPC-H SF {results['sf']:g}, {node}",
        "",
        f"Median of {results['runs']} cold runs each (a fresh process tree per run). {meter}",
        "",
        "| query | engine | ranks | ok | s | peak MiB | ranks MiB | spill MiB | OOM kills | x DuckDB time "
        "| x DuckDB memory | x DuckDB (ranks) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in results["points"]:
        ok = "yes" if p["ok"] and p.get("correct", True) else ("WRONG" if p["ok"] else "failed")
        ratio_t = f"{p['time_ratio']:.2f}" if "time_ratio" in p else ""
        ratio_m = f"{p['memory_ratio']:.2f}" if "memory_ratio" in p else ""
        ratio_r = f"{p['rank_memory_ratio']:.2f}" if "rank_memory_ratio" in p else ""
        ranks_mib = f"{p['peak_rank_bytes'] / 2**20:.0f}" if "peak_rank_bytes" in p else ""
        lines.append(
            f"| {p['query']} | {p['engine']} | {p['ranks']} | {ok} | {p['seconds']:.2f} | "
            f"{p['peak_anon_bytes'] / 2**20:.0f} | {ranks_mib} | {p['peak_spill_bytes'] / 2**20:.0f} | "
            f"{p['oom_kills']} | {ratio_t} | {ratio_m} | {ratio_r} |"
        )
    return "\n".join(lines) + "\n"
