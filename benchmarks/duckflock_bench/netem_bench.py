"""``duckflock bench netem``: Flight workers on "hosts" (network namespaces,
``duckflock.testing.netns``) whose links are shaped to a rate (and delay, where the kernel has
sch_netem), for each wire compression: where the time goes (DuckDB compute vs exchange CPU vs
waiting on the network) and what compression saves. Writes results.json, results.md and netem.png
(through ``flight_bench.run``).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from duckflock.testing.compare import same_result
from duckflock.testing.tables import oracle
from duckflock.testing.workers import FlightWorkers
from duckflock_bench.flight_common import ORDER_BY, ensure_data, first_line, header, query_text, yes
from duckflock_bench.jobs import err, write_json
from duckflock_bench.measure import cores, machine_info, median, timed, versions
from duckflock_bench.report import bytes_or_dash


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
    from duckflock.testing.netns import Hosts, NamespacesUnavailable, parse_delay, parse_rate, unavailable

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
    base = oracle(data, cores())
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
            err.out(f"bench netem: {shaping}; one TCP stream measures {measured / 1e9:.2f} Gbit/s")
            for compression in compressions:
                config = {"compression": compression, "threads": threads, "shared_storage": shared_storage}
                for name in names:
                    err.out(f"  {rate} {compression} {name}")
                    try:
                        point = _netem_point(hosts, workers, config, name, expected[name], runs)
                    except Exception as e:
                        results["errors"].append(
                            {"rate": rate, "compression": compression, "query": name, "error": first_line(e)}
                        )
                        err.out(f"  failed: {first_line(e)}")
                        continue
                    results["points"].append({"rate": rate, "compression": compression, **point})
                    write_json(out / "results.json", results)
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
        correct = [same_result(warm.arrow(), expected, order)]
        del warm
        samples = []
        for _ in range(runs):
            before = sum(hosts.link_tx_bytes())
            seconds, result = timed(lambda: db.sql(sql, profile=True))
            link = sum(hosts.link_tx_bytes()) - before
            correct.append(same_result(result.arrow(), expected, order))
            samples.append({"total_s": seconds, "link_bytes": float(link), **stats_split(result.stats)})
            del result
    keys = ("total_s", "compute_s", "exchange_cpu_s", "network_wait_s", "exchange_bytes", "link_bytes")
    return {
        "query": name,
        "rows": expected.num_rows,
        # Sent to the caller by worker 0's do_get, never compressed: part of "link bytes".
        "result_bytes": float(expected.nbytes),
        **{k: median([s[k] for s in samples]) for k in keys},
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
    lines += [*header(results["machine"], results["versions"]), ""]
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
            f"| {p['exchange_cpu_s']:.3f} | {p['network_wait_s']:.3f} | {bytes_or_dash(p['exchange_bytes'])} "
            f"| {bytes_or_dash(p['result_bytes'])} | {bytes_or_dash(p['link_bytes'])} | {saved} | {rel} "
            f"| {yes(p['correct'])} |"
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

    from duckflock_bench.plots import stacked_bars

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
        stacked_bars(ax, labels, [(label, color, [p[key] for p in points]) for key, label, color in layers])
        ax.scatter(labels, [p["total_s"] for p in points], color="black", marker="_", s=300, zorder=3,
                   label="total (caller)")  # fmt: skip
        for i, p in enumerate(points):
            ax.annotate(bytes_or_dash(p["exchange_bytes"]), (i, p["total_s"]), ha="center", va="bottom",
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
