"""``duckflock bench memory``: queries that need more memory than a node has, in a memory cgroup of
that size, next to single-process DuckDB in the same cgroup.

Each run is a fresh process tree (``duckflock sql --output`` for duckflock, a Python process for
DuckDB) in a fresh cgroup; reported per query and rank count: time, peak anonymous memory of the
whole tree (page cache excluded), peak bytes in the spill directory, OOM kills, and whether the
result equals DuckDB's (both written to Parquet and compared). With ``--node-memory none`` no limit
is set and only the memory is measured.
"""

from __future__ import annotations

import os
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from duckflock.errors import DuckflockError
from duckflock.ingest.tpch import generate_tpch
from duckflock.testing.compare import difference
from duckflock.testing.tpch import ORDER, query
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
    why = available()
    if why is not None:
        raise DuckflockError(f"bench memory {why}")
    limit = parse_bytes(node_memory)
    unknown = [n for n in names if n not in QUERIES]
    if unknown:
        raise DuckflockError(f"unknown queries {unknown}; choose from {sorted(QUERIES)}")
    data = Path(data_root) / f"tpch-sf{sf:g}"
    generate_tpch(sf, data, progress=True)
    results: dict = {
        "sf": sf,
        "node_memory_bytes": limit,
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
            base = _repeat(runs, _duckdb, data, qfile, want_path, limit, work)
            want = pq.read_table(want_path) if base["ok"] else None
            results["points"].append({"query": name, "engine": "duckdb", "ranks": 1, **base})
            _say(name, "DuckDB", base)
            for n in ranks:
                got_path = work / f"duckflock-{n}.parquet"
                point = _repeat(runs, _duckflock, data, name, n, got_path, limit, work)
                if point["ok"] and want is not None:
                    problem = difference(pq.read_table(got_path), want, _ORDER.get(name))
                    point["correct"], point["problem"] = problem is None, problem
                if base["ok"] and point["ok"]:
                    point["time_ratio"] = point["seconds"] / base["seconds"]
                    point["memory_ratio"] = point["peak_anon_bytes"] / max(base["peak_anon_bytes"], 1)
                results["points"].append({"query": name, "engine": "duckflock", "ranks": n, **point})
                _say(name, f"{n} ranks", point)
    write_json(out / "results.json", results)
    return results


def _duckdb(data: Path, qfile: Path, result: Path, limit: int | None, work: Path) -> Measured:
    spill = work / "spill-duckdb"
    spill.mkdir(exist_ok=True)
    cmd = [sys.executable, "-c", _DUCKDB_SCRIPT, str(data), str(qfile), str(spill), str(result)]
    return run_in_cgroup(cmd, limit, spill, os.environ.copy(), timeout=900)


def _duckflock(data: Path, name: str, ranks: int, result: Path, limit: int | None, work: Path) -> Measured:
    spill = work / "spill-duckflock"
    spill.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "duckflock.cli.main", "sql", "--data", str(data), "--ranks", str(ranks)]
    cmd += ["--output", str(result), QUERIES[name]]
    env = {**os.environ, "DUCKFLOCK_TEMP_DIR": str(spill)}
    return run_in_cgroup(cmd, limit, spill, env, timeout=900)


def _repeat(runs: int, once: Callable[..., Measured], *args: object) -> dict:
    """Medians over ``runs`` runs of ``once(*args)``; a failed run ends the series."""
    measured: list[Measured] = []
    for _ in range(runs):
        m = once(*args)
        measured.append(m)
        if m.returncode != 0:
            break
    last = measured[-1]
    ok = last.returncode == 0
    return {
        "ok": ok,
        "seconds": median([m.seconds for m in measured]),
        "peak_anon_bytes": max(m.peak_anon_bytes for m in measured),
        "peak_spill_bytes": max(m.peak_spill_bytes for m in measured),
        "oom_kills": sum(m.oom_kills for m in measured),
        "error": None if ok else (last.stderr.strip().splitlines() or [f"exit code {last.returncode}"])[-1],
    }


def _say(name: str, who: str, p: dict) -> None:
    if not p["ok"]:
        err.print(f"  {name:5} {who:9} FAILED ({p['oom_kills']} OOM kills): {p['error']}", highlight=False)
        return
    extra = ""
    if "time_ratio" in p:
        extra = f"  {p['time_ratio']:.2f}x time, {p['memory_ratio']:.2f}x memory"
    if p.get("correct") is False:
        extra += f"  WRONG: {p['problem']}"
    err.print(
        f"  {name:5} {who:9} {p['seconds']:7.2f} s  peak {p['peak_anon_bytes'] / 2**20:7.0f} MiB  "
        f"spill {p['peak_spill_bytes'] / 2**20:6.0f} MiB{extra}",
        highlight=False,
    )


def memory_markdown(results: dict) -> str:
    limit = results["node_memory_bytes"]
    node = f"{limit / 2**30:.2f} GiB cgroup" if limit else "no memory limit"
    lines = [
        f"# Memory: TPC-H SF {results['sf']:g}, {node}",
        "",
        f"Median of {results['runs']} cold runs each (a fresh process tree per run, same cgroup size). "
        "Peak: anonymous memory of the whole process tree (page cache excluded), sampled every 50 ms.",
        "",
        "| query | engine | ranks | ok | s | peak MiB | spill MiB | OOM kills | x DuckDB time "
        "| x DuckDB memory |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in results["points"]:
        ok = "yes" if p["ok"] and p.get("correct", True) else ("WRONG" if p["ok"] else "failed")
        ratio_t = f"{p['time_ratio']:.2f}" if "time_ratio" in p else ""
        ratio_m = f"{p['memory_ratio']:.2f}" if "memory_ratio" in p else ""
        lines.append(
            f"| {p['query']} | {p['engine']} | {p['ranks']} | {ok} | {p['seconds']:.2f} | "
            f"{p['peak_anon_bytes'] / 2**20:.0f} | {p['peak_spill_bytes'] / 2**20:.0f} | {p['oom_kills']} | "
            f"{ratio_t} | {ratio_m} |"
        )
    return "\n".join(lines) + "\n"
