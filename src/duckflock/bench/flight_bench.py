"""``duckflock bench flight`` and ``duckflock bench netem``: duckflock's Arrow Flight workers measured.

flight: Flight workers on loopback vs the same number of MPI ranks vs single-process DuckDB, per
    query (seed join, TPC-H Q3/Q5/Q9/Q18). All three systems are warm and alive at once; their runs
    are interleaved (in a rotating order) so that noise on this machine hits them alike. Every
    worker/rank gets its share of the cores (``threads = cores // n``); DuckDB gets all of them.
netem: Flight workers on "hosts" (network namespaces, ``bench.netns``) whose links are shaped to a
    rate (and delay, where the kernel has sch_netem), for each wire compression: where the time goes
    (DuckDB compute vs exchange CPU vs waiting on the network) and what compression saves.

Both write results.json, results.md and a PNG; timings are reported, never judged. The exit code is
non-zero only when a point failed or gave a result that differs from DuckDB's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import selectors
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa

from duckflock.bench.baseline import baseline_connection, same_result
from duckflock.bench.measure import cores, machine_info, parse_list, versions
from duckflock.bench.phases import summarize
from duckflock.bench.seed_job import SEED
from duckflock.bench.tpch import query
from duckflock.errors import DuckflockError

FLIGHT_TARGET = 1.5  # the issue's goal: Flight on loopback within 1.5x of MPI
# Columns whose order each query's ORDER BY fixes (the rest is compared as a multiset).
ORDER_BY = {
    "seed": ["o_orderdate"],
    "q3": ["revenue"],
    "q5": ["revenue"],
    "q9": ["nation", "o_year"],
    "q18": ["o_totalprice"],
}


# ---- command line ----------------------------------------------------------------------------------
def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``flight`` and ``netem`` under ``duckflock bench``."""
    f = subparsers.add_parser("flight", help="Flight workers on loopback vs MPI ranks vs DuckDB")
    f.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    f.add_argument("--workers", default="2,4", help="worker (and rank) counts, comma separated")
    f.add_argument("--runs", type=int, default=5, help="timed runs per query and system (median)")
    f.add_argument("--queries", default="seed,q3,q5,q9,q18", help="seed and/or qN, comma separated")
    f.add_argument("--data-root", default="data", help="where TPC-H data directories are kept")
    f.add_argument("--out", default="bench-results/flight", help="output directory")
    n = subparsers.add_parser("netem", help="Flight workers on namespace hosts over shaped links")
    n.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    n.add_argument("--hosts", type=int, default=3, help="hosts (namespaces), one worker each")
    n.add_argument("--rates", default="1gbit,10gbit", help="link rates (tc syntax), comma separated")
    n.add_argument("--delay", default="0.2ms", help="one-way delay between hosts (needs sch_netem)")
    n.add_argument("--compression", default="none,lz4,zstd", help="wire compressions, comma separated")
    n.add_argument("--runs", type=int, default=3, help="timed runs per point (median)")
    n.add_argument("--queries", default="seed,q3,q9", help="seed and/or qN, comma separated")
    n.add_argument(
        "--shared-storage",
        action="store_true",
        help="let workers read small tables from the shared data directory instead of broadcasting "
        "them (default: off, like hosts with their own disks)",
    )
    n.add_argument("--data-root", default="data", help="where TPC-H data directories are kept")
    n.add_argument("--out", default="bench-results/netem", help="output directory")


def run(args: argparse.Namespace) -> int:
    if args.runs < 1:
        raise DuckflockError("--runs must be at least 1")
    if args.sf <= 0:
        raise DuckflockError(f"--sf must be positive, got {args.sf}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = _query_names(args.queries)
    if args.bench == "flight":
        counts = parse_list(args.workers, int)
        if not counts or min(counts) < 1:
            raise DuckflockError(f"--workers needs positive counts, got {args.workers!r}")
        results = run_flight(args.sf, counts, args.runs, names, Path(args.data_root), out)
        md = flight_markdown(results)
        figure = flight_figure(results, out / "flight_vs_mpi.png")
    elif args.bench == "netem":
        from duckflock.bench.netns import NamespacesUnavailable

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
            _say(f"bench netem skipped: network namespaces are unavailable here: {e}")
            return 0
        md = netem_markdown(results)
        figure = netem_figure(results, out / "netem.png")
    else:
        raise DuckflockError(f"unknown benchmark {args.bench}")
    (out / "results.md").write_text(md)
    _write_json(out / "results.json", results)
    _print_markdown(md)
    _say(f"wrote {out / 'results.json'}, {out / 'results.md'}, {figure}")
    points = results["points"]
    return 0 if points and not results["errors"] and all(p["correct"] for p in points) else 1


def _query_names(text: str) -> list[str]:
    names = [q.strip().lower() for q in text.split(",") if q.strip()]
    for q in names:
        if q != "seed" and not (re.fullmatch(r"q\d+", q) and 1 <= int(q[1:]) <= 22):
            raise DuckflockError(f"unknown query {q!r}: use seed or q1..q22")
    if not names:
        raise DuckflockError("--queries is empty")
    return names


def query_text(name: str) -> str:
    return SEED if name == "seed" else query(int(name[1:]))


# ---- small helpers ---------------------------------------------------------------------------------
def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _write_json(path: Path, obj: object) -> None:
    from duckflock.bench.jobs import write_json

    write_json(path, obj)


def _print_markdown(text: str) -> None:
    from duckflock.bench.report import print_markdown

    print_markdown(text)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _timed(fn: Callable[[], pa.Table]) -> tuple[float, pa.Table]:
    t0 = time.perf_counter()
    table = fn()
    return time.perf_counter() - t0, table


def _same(got: pa.Table, expected: pa.Table, order_by: list[str]) -> bool:
    """Equal to DuckDB's result. Arrow's exact comparison first (fast); only when it fails the shared
    tolerant one (floats within 1e-9: a distributed sum adds in another order), which is slow on
    large results because it compares Python rows."""
    from duckflock.bench.compare import difference

    return same_result(got, expected, order_by) or difference(got, expected, order_by) is None


def data_dir(data_root: Path, sf: float) -> Path:
    return data_root / f"tpch-sf{sf:g}"


def ensure_data(data_root: Path, sf: float) -> Path:
    from duckflock.ingest.tpch import generate_tpch

    data = data_dir(data_root, sf).resolve()
    generate_tpch(sf, data, parts=12, progress=True)  # a no-op when the data is already there
    return data


def _header(machine: dict, vers: dict) -> list[str]:
    return [
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gb']} GB RAM; load "
        f"average at start {machine.get('load_average_at_start')}.",
        f"Versions: duckdb {vers.get('duckdb')}, pyarrow {vers.get('pyarrow')}, mpi4py {vers.get('mpi4py')}.",
    ]


def _bytes(n: float | None) -> str:
    if n is None or n != n:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


# ---- Flight workers --------------------------------------------------------------------------------
class FlightWorkers:
    """``duckflock worker`` processes, one per (address, command prefix) host; a context manager.
    The prefix runs a worker elsewhere, e.g. ``ip netns exec <namespace>``."""

    def __init__(self, data: Path, hosts: list[tuple[str, list[str]]], workdir: Path, timeout: float = 60):
        workdir.mkdir(parents=True, exist_ok=True)
        self.token = secrets.token_hex(16)
        token_file = workdir / "token"
        token_file.write_text(self.token)
        token_file.chmod(0o600)
        self.procs: list[subprocess.Popen] = []
        self.addresses: list[str] = []
        try:
            for i, (host, prefix) in enumerate(hosts):
                with open(workdir / f"worker{i}.log", "w") as log:
                    cmd = [
                        *prefix, sys.executable, "-m", "duckflock.cli.main", "worker",
                        "--listen", f"{host}:0", "--data", str(data), "--token-file", str(token_file),
                    ]  # fmt: skip
                    self.procs.append(
                        subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log)
                    )
            deadline = time.monotonic() + timeout
            for i, proc in enumerate(self.procs):
                self.addresses.append(_listening_address(proc, deadline, workdir / f"worker{i}.log"))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
            if p.stdout is not None:
                p.stdout.close()

    def __enter__(self) -> FlightWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _listening_address(proc: subprocess.Popen, deadline: float, log: Path) -> str:
    """HOST:PORT from the worker's start-up line (it picks a free port itself). Raw reads, not
    readline: a line wrapped by the worker's console must not leave text stuck in a buffer."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    seen = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline and sel.select(timeout=max(0.0, deadline - time.monotonic())):
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            seen += chunk
            m = re.search(rb"on grpc\+(?:tcp|tls)://(\S+):(\d+)", seen.replace(b"\n", b" "))
            if m:
                return f"{m.group(1).decode()}:{m.group(2).decode()}"
    tail = log.read_text()[-2000:] if log.exists() else ""
    raise DuckflockError(
        f"a duckflock worker did not start: {seen.decode(errors='replace').strip()!r} {tail}"
    )


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
    base = baseline_connection(data, ncores)
    try:
        for n in counts:
            threads = max(1, ncores // n)
            config = {"threads": threads}
            _say(f"bench flight: sf={sf:g}, {n} Flight workers and {n} MPI ranks, {threads} threads each")
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
                        _say(f"  {name}")
                        try:
                            point = _flight_point(name, fdb, mdb, base, runs)
                        except Exception as e:  # one failed query must not hide the others' numbers
                            results["errors"].append({"workers": n, "query": name, "error": _first(e)})
                            _say(f"  {name} failed: {_first(e)}")
                            continue
                        results["points"].append({"workers": n, "threads": threads, **point})
                        _write_json(out / "results.json", results)  # partial results survive a crash
            except Exception as e:
                results["errors"].append({"workers": n, "query": None, "error": _first(e)})
                _say(f"bench flight: {n} workers failed: {_first(e)}")
    finally:
        base.close()
    results["wall_s"] = time.perf_counter() - t_start
    return results


def _first(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


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
    warm = {k: _timed(fn) for k, fn in systems.items() if k != "duckdb"}
    correct = {k: [_same(t, expected, order)] for k, (_, t) in warm.items()}
    times: dict[str, list[float]] = {k: [] for k in systems}
    keys = list(systems)
    for r in range(runs):
        for k in keys[r % 3 :] + keys[: r % 3]:  # rotate who goes first
            seconds, table = _timed(systems[k])
            times[k].append(seconds)
            if k != "duckdb":
                correct[k].append(_same(table, expected, order))
            del table
    profiles = {}
    for k, db in (("flight", fdb), ("mpi", mdb)):
        seconds, result = _timed(lambda db=db: db.sql(sql, profile=True))
        correct[k].append(_same(result.arrow(), expected, order))
        profiles[k] = summarize(result.stats, seconds)
    med = {k: _median(v) for k, v in times.items()}
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
    lines += [*_header(results["machine"], results["versions"]), ""]
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
                f"| {_bytes(p['bytes_exchanged_flight'])} / {_bytes(p['bytes_exchanged_mpi'])} "
                f"| {_yes(p['flight_correct'])} | {_yes(p['mpi_correct'])} |"
            )
        met = sum(p["flight_over_mpi"] <= results["target_flight_over_mpi"] for p in points)
        lines += [
            "",
            f"Flight within {results['target_flight_over_mpi']}x of MPI: {met} of {len(points)}.",
            "",
        ]
    lines += _error_lines(results, "workers")
    return "\n".join(lines) + "\n"


def _yes(ok: bool) -> str:
    return "yes" if ok else "**NO**"


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


# ---- bench netem -----------------------------------------------------------------------------------
def stats_split(stats: list) -> dict[str, float]:
    """Where one profiled query's time went, each part summed over a rank's stages, max over ranks:
    DuckDB compute; exchange CPU (split by target + Arrow IPC encode, incl. compression); network
    wait (blocked on back-pressure while sending + waiting for/receiving inputs, which includes
    decoding/decompressing them and waiting on slower peers)."""
    compute: dict[int, float] = {}
    cpu: dict[int, float] = {}
    wait: dict[int, float] = {}
    for s in stats:
        e = s.exchange
        compute[s.rank] = compute.get(s.rank, 0.0) + s.compute_s
        cpu[s.rank] = cpu.get(s.rank, 0.0) + e.partition_s + e.serialize_s
        wait[s.rank] = wait.get(s.rank, 0.0) + e.send_wait_s + e.recv_wait_s
    return {
        "compute_s": max(compute.values(), default=0.0),
        "exchange_cpu_s": max(cpu.values(), default=0.0),
        "network_wait_s": max(wait.values(), default=0.0),
        "exchange_bytes": float(sum(s.exchange.bytes_out for s in stats)),
    }


_PROBE_SERVER = """
import socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1); print(s.getsockname()[1], flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    t0 = t0 or time.perf_counter(); n += len(b)
print(n * 8 / (time.perf_counter() - t0), flush=True)
"""
_PROBE_CLIENT = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); b = b"x" * (1 << 20); t0 = time.perf_counter()
while time.perf_counter() - t0 < float(sys.argv[3]):
    c.sendall(b)
c.close()
"""


def link_probe(hosts, seconds: float = 1.5) -> float:
    """TCP bits/s from host 0 to host 1 (one stream): what the shaped link really delivers here."""
    server = subprocess.Popen(
        [*hosts.prefix(1), sys.executable, "-c", _PROBE_SERVER, hosts.address(1)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        subprocess.run(
            [*hosts.prefix(0), sys.executable, "-c", _PROBE_CLIENT, hosts.address(1), port, str(seconds)],
            check=True, timeout=60,
        )  # fmt: skip
        return float(server.stdout.readline().strip())
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(timeout=10)
        if server.stdout is not None:
            server.stdout.close()


def run_netem(
    sf: float,
    nhosts: int,
    rates: list[str],
    delay: str | None,
    compressions: list[str],
    runs: int,
    names: list[str],
    shared_storage: bool,
    data_root: Path,
    out: Path,
) -> dict:
    from duckflock.bench.netns import Hosts, NamespacesUnavailable, parse_delay, parse_rate, unavailable

    reason = unavailable()
    if reason:  # before generating data or starting anything
        raise NamespacesUnavailable(reason)
    for r in rates:
        parse_rate(r)  # fail on a typo before building anything
    if delay:
        parse_delay(delay)
    data = ensure_data(data_root, sf)
    threads = max(1, cores() // nhosts)  # the "hosts" share this machine's cores
    results: dict = {
        "benchmark": "netem",
        "sf": sf,
        "data": str(data),
        "hosts": nhosts,
        "threads": threads,
        "runs": runs,
        "delay": delay,
        "shared_storage": shared_storage,
        "queries": {q: query_text(q) for q in names},
        "machine": machine_info(memcpy=False),
        "versions": versions(with_mpi=False),  # mpi4py.MPI here would make this process an MPI singleton
        "links": [],
        "points": [],
        "errors": [],
    }
    t_start = time.perf_counter()
    base = baseline_connection(data, cores())
    expected = {q: base.sql(query_text(q)).to_arrow_table() for q in names}
    base.close()
    with (
        Hosts(nhosts, strict_delay=False) as hosts,
        FlightWorkers(
            data, [(hosts.address(i), hosts.prefix(i)) for i in range(nhosts)], out / "workers"
        ) as workers,
    ):
        for rate in rates:
            shaping = hosts.set_link(rate, delay)
            measured = link_probe(hosts)
            results["links"].append({"rate": rate, "shaping": shaping, "measured_bps": measured})
            _say(f"bench netem: {shaping}; one TCP stream measures {measured / 1e9:.2f} Gbit/s")
            for compression in compressions:
                config = {"compression": compression, "threads": threads, "shared_storage": shared_storage}
                for name in names:
                    _say(f"  {rate} {compression} {name}")
                    try:
                        point = _netem_point(hosts, workers, config, name, expected[name], runs)
                    except Exception as e:
                        results["errors"].append(
                            {"rate": rate, "compression": compression, "query": name, "error": _first(e)}
                        )
                        _say(f"  failed: {_first(e)}")
                        continue
                    results["points"].append({"rate": rate, "compression": compression, **point})
                    _write_json(out / "results.json", results)
    _add_savings(results["points"])
    results["wall_s"] = time.perf_counter() - t_start
    return results


@contextlib.contextmanager
def _session(workers: FlightWorkers, config: dict) -> Iterator:
    import duckflock

    with duckflock.connect(workers=workers.addresses, token=workers.token, config=config) as db:
        yield db


def _netem_point(
    hosts, workers: FlightWorkers, config: dict, name: str, expected: pa.Table, runs: int
) -> dict:
    sql = query_text(name)
    order = ORDER_BY.get(name, [])
    with _session(workers, config) as db:
        warm = db.sql(sql)  # the first run of a session pays for opening streams and file metadata
        correct = [_same(warm.arrow(), expected, order)]
        del warm
        samples = []
        for _ in range(runs):
            before = sum(hosts.link_tx_bytes())
            seconds, result = _timed(lambda: db.sql(sql, profile=True))
            link = sum(hosts.link_tx_bytes()) - before
            correct.append(_same(result.arrow(), expected, order))
            samples.append({"total_s": seconds, "link_bytes": float(link), **stats_split(result.stats)})
            del result
    keys = ("total_s", "compute_s", "exchange_cpu_s", "network_wait_s", "exchange_bytes", "link_bytes")
    return {
        "query": name,
        "rows": expected.num_rows,
        # Sent to the caller by worker 0's do_get, never compressed: part of "link bytes".
        "result_bytes": float(expected.nbytes),
        **{k: _median([s[k] for s in samples]) for k in keys},
        "samples": samples,
        "correct": all(correct),
    }


def _add_savings(points: list[dict]) -> None:
    """Each point's bytes and time relative to the uncompressed run of the same rate and query."""
    plain = {(p["rate"], p["query"]): p for p in points if p["compression"] == "none"}
    for p in points:
        ref = plain.get((p["rate"], p["query"]))
        ok = ref is not None and ref["exchange_bytes"] > 0 and ref["total_s"] > 0
        p["bytes_saved"] = 1 - p["exchange_bytes"] / ref["exchange_bytes"] if ok else None
        p["time_vs_none"] = p["total_s"] / ref["total_s"] if ok else None


def netem_markdown(results: dict) -> str:
    lines = [f"# Flight workers over shaped links (TPC-H SF {results['sf']:g}, {results['hosts']} hosts)", ""]
    lines += [*_header(results["machine"], results["versions"]), ""]
    lines += [
        f"Hosts: {results['hosts']} Linux network namespaces on one bridge, one `duckflock worker` each "
        f"({results['threads']} DuckDB threads: they share this machine's cores), the caller in the root "
        f"namespace; shared storage {'on' if results['shared_storage'] else 'off (small tables broadcast)'}. "
        f"Every host's link is shaped in both directions. Medians of {results['runs']} profiled runs "
        "after 1 warm-up per point. total: wall time seen by the caller (incl. the result's transfer). "
        "compute: DuckDB, max over workers of the sum over stages. exchange CPU: split by target + "
        "Arrow IPC encode (incl. compression). network wait: blocked sending + waiting for/receiving "
        "inputs (incl. decoding and waiting on slower peers). exchange bytes: IPC payloads between "
        "workers (compressed as configured); result: the result's Arrow size, sent uncompressed to the "
        "caller; link bytes: everything the hosts sent on their links (TCP/IP, gRPC, heartbeats, the "
        "result). bytes saved / time: exchange bytes and total time vs. `none` at the same rate.",
        "",
        "| link | shaping | one TCP stream measured |",
        "|---|---|---:|",
    ]
    for link in results["links"]:
        lines.append(f"| {link['rate']} | {link['shaping']} | {link['measured_bps'] / 1e9:.2f} Gbit/s |")
    lines += [
        "",
        "| link | compression | query | total s | compute s | exchange CPU s | network wait s "
        "| exchange bytes | result (Arrow) | link bytes | bytes saved | time vs none | correct |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for p in results["points"]:
        saved = "-" if p["bytes_saved"] is None else f"{100 * p['bytes_saved']:.0f}%"
        rel = "-" if p["time_vs_none"] is None else f"{p['time_vs_none']:.2f}x"
        lines.append(
            f"| {p['rate']} | {p['compression']} | {p['query']} | {p['total_s']:.3f} | {p['compute_s']:.3f} "
            f"| {p['exchange_cpu_s']:.3f} | {p['network_wait_s']:.3f} | {_bytes(p['exchange_bytes'])} "
            f"| {_bytes(p['result_bytes'])} | {_bytes(p['link_bytes'])} | {saved} | {rel} "
            f"| {_yes(p['correct'])} |"
        )
    lines.append("")
    lines += [
        f"- failed: {e['rate']} {e['compression']} {e['query']}: {e['error']}" for e in results["errors"]
    ]
    return "\n".join(lines) + "\n"


def netem_figure(results: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["queries"])
    fig, axes = plt.subplots(1, max(1, len(names)), figsize=(5 * max(1, len(names)), 4.2), squeeze=False)
    layers = (
        ("compute_s", "compute", "#1f77b4"),
        ("exchange_cpu_s", "exchange CPU", "#e377c2"),
        ("network_wait_s", "network wait", "#17becf"),
    )
    for ax, name in zip(axes[0], names, strict=False):
        points = [p for p in results["points"] if p["query"] == name]
        labels = [f"{p['rate']}\n{p['compression']}" for p in points]
        bottom = [0.0] * len(points)
        for key, label, color in layers:
            values = [p[key] for p in points]
            ax.bar(labels, values, bottom=bottom, color=color, label=label, width=0.6)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.scatter(labels, [p["total_s"] for p in points], color="black", marker="_", s=300, zorder=3,
                   label="total (caller)")  # fmt: skip
        for i, p in enumerate(points):
            ax.annotate(_bytes(p["exchange_bytes"]), (i, p["total_s"]), ha="center", va="bottom",
                        fontsize=7, xytext=(0, 4), textcoords="offset points")  # fmt: skip
        ax.set_title(name)
        ax.set_ylabel("seconds (median; parts: max over workers)")
        ax.tick_params(axis="x", labelsize=7)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", fontsize=8)
    fig.suptitle("Flight workers on namespace hosts: time split and bytes exchanged (labels)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.88, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m duckflock.bench.flight_bench flight|netem ...`` (also ``duckflock bench ...``)."""
    parser = argparse.ArgumentParser(prog="duckflock-bench")
    add_parser(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(argv)
    try:
        return run(args)
    except DuckflockError as e:
        _say(f"error: {e}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
