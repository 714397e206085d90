"""Markdown reports of the benchmark results (results.md), also printed with rich."""

from __future__ import annotations

from rich.console import Console
from rich.markdown import Markdown

from duckflock.units import human
from duckflock_bench.measure import GB


def _s(x: float) -> str:
    return f"{x:.3f}"


def bytes_or_dash(n: float | None) -> str:
    """Bytes for people to read, or ``-`` where the count is missing (None or NaN)."""
    return "-" if n is None or n != n else human(n, "B")


def _mb(kb: float) -> str:
    return f"{kb / 1024:.0f} MiB"


def _header(results: dict) -> list[str]:
    m = results["machine"]
    v = results.get("versions", {})
    lines = [
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB RAM; load average at start "
        f"{m.get('load_average_at_start')}.",
    ]
    if v:
        lines.append(
            f"Versions: duckdb {v.get('duckdb')}, pyarrow {v.get('pyarrow')}, mpi4py {v.get('mpi4py')}, "
            f"{v.get('mpi', 'MPI ?')}."
        )
    return lines


def seed_markdown(results: dict) -> str:
    lines = ["# Seed benchmark: customer ⋈ orders, ORDER BY o_orderdate DESC", ""]
    lines += [*_header(results), ""]
    if "memcpy_gbps" in results["machine"]:
        lines.append(f"memcpy (numpy, 512 MB, median of 5): {results['machine']['memcpy_gbps']:.2f} GB/s.")
    lines += [
        f"Query: `{results['query']}`",
        "",
        f"Medians of {results['runs']} warm runs per point; duckflock and DuckDB runs interleaved in one "
        "job. "
        "DuckDB = single process, all cores, same Parquet files. Phases (s, median): overhead = plan + "
        "dispatch + profile collection; compute = max over ranks of DuckDB time in non-final stages; "
        "exchange = max over ranks of partition + serialize + send wait; wait = max over ranks of "
        "waiting for / receiving inputs (on the driver: collecting the results); final = driver's "
        "final stage (the sort). Memory = sum over ranks of peak RSS vs. peak RSS of a fresh DuckDB "
        "process running the query once. Node mem = the same ranks on this one node, where the "
        "shared-library pages they all map are resident once: sum over ranks of (peak RSS - "
        "file-backed RSS) + the largest file-backed RSS.",
        "",
    ]
    for entry in results["scale_factors"]:
        lines += [f"## SF {entry['sf']:g}", ""]
        if not entry["points"]:
            lines += ["(no successful runs)", ""]
            continue
        lines.append(
            "| ranks | duckflock s | DuckDB s | ratio | overhead | compute | exchange | wait | final "
            "| bytes exchanged | peak mem (sum) | DuckDB peak | mem ratio | node mem ratio | correct |"
        )
        lines.append("|" + "---:|" * 14 + ":---:|")
        for p in entry["points"]:
            ph = p["phases_median_s"]
            lines.append(
                f"| {p['ranks']} | {_s(p['duckflock_median_s'])} | {_s(p['duckdb_median_s'])} "
                f"| {p['ratio']:.2f}x | {_s(ph['overhead'])} | {_s(ph['compute'])} | {_s(ph['exchange'])} "
                f"| {_s(ph['wait'])} | {_s(ph['final'])} | {human(p['bytes_exchanged'], 'B')} "
                f"| {_mb(p['peak_rss_kb_sum'])} | {_mb(p['duckdb_peak_rss_kb'])} | {p['memory_ratio']:.2f}x "
                f"| {p.get('node_memory_ratio', float('nan')):.2f}x | {'yes' if p['correct'] else '**NO**'} |"
            )
        lines.append("")
        lines.append(f"Result rows: {entry['points'][0]['rows']}.")
        lines.append("")
    for e in results.get("errors", []):
        lines.append(f"- failed: sf={e['sf']:g} ranks={e['ranks']}: {e['error'].splitlines()[0]}")
    return "\n".join(lines) + "\n"


def exchange_markdown(results: dict) -> str:
    lines = ["# Exchange benchmark: all-to-all hash shuffle", ""]
    lines += [*_header(results), ""]
    lines += [
        f"{results['gb']:g} GB of Arrow data in total per run (BIGINT, BIGINT, DOUBLE, short VARCHAR), "
        f"split by a DuckDB-computed `hash(key) % ranks` column and shuffled with ExchangeWriter + "
        f"read_exchange over the MPI mux. GB/s = total input bytes (all ranks) / wall time (slowest "
        f"rank), median of {results['runs']} runs after 1 untimed warm-up run. memcpy: numpy copy of "
        "512 MB on rank 0, median of 5; MPI p2p: mpi4py Send/Recv of 64 MB from rank 0 to 1, median "
        "of 5; both in the same job. "
        "Phase columns: max over ranks (s, median of runs). Page faults: minor faults during a run, "
        "all ranks (each a first touch of a fresh 4 KiB page; expensive on some VMs). CPU busy: CPU "
        "time of all rank processes (compute, mux thread, kernel copies) / (wall * cores). Split "
        "only: every rank splitting its batches by target at once, no communication — the "
        "ceiling for the shuffle.",
        "",
        "| ranks | GB | GB/s | memcpy GB/s | ratio to memcpy | >= 1/2 memcpy | MPI p2p GB/s | partition "
        "| serialize | send wait | recv wait | wall s | on the wire | page faults | CPU busy "
        "| split only GB/s | peak RSS (sum) | warm-up GB/s | correct |",
        "|" + "---:|" * 18 + ":---:|",
    ]
    for p in results["points"]:
        ph = p["phases_median_s"]
        p2p = p["mpi_p2p_gbps"]
        cells = [
            str(p["ranks"]),
            f"{p['input_gb']:.2f}",
            f"{p['gbps_median']:.2f}",
            f"{p['memcpy_gbps']:.2f}",
            f"{p['ratio_to_memcpy']:.2f}",
            "yes" if p["meets_half_memcpy"] else "no",
            "-" if p2p is None else f"{p2p:.2f}",
            *(
                _s(ph[k])
                for k in ("max_partition_s", "max_serialize_s", "max_send_wait_s", "max_recv_wait_s")
            ),
            _s(p["wall_median_s"]),
            f"{p['wire_gb']:.2f} GB",
            _faults(p),
            f"{p['cpu_busy_median']:.0%}",
            f"{p['split_only_gbps']:.2f}",
            _mb(p["peak_rss_kb_sum"]),
            f"{p['warmup_gbps']:.2f}",
            "yes" if p["correct"] else "**NO**",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for e in results.get("errors", []):
        lines.append(f"- failed: ranks={e['ranks']}: {e['error'].splitlines()[0]}")
    return "\n".join(lines) + "\n"


def _faults(p: dict) -> str:
    n = p.get("minor_faults_median")
    return "-" if n is None else f"{n / 1e3:.0f}K ({n * 4096 / GB:.1f} GB)"


def print_markdown(text: str) -> None:
    Console(width=200).print(Markdown(text))
