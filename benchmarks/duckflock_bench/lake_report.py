"""``bench lake``'s markdown and PNG figures, with the issue's targets stated beside the numbers."""

from __future__ import annotations

from pathlib import Path

from duckflock_bench.lake_exchange import exchange_markdown

S3_TARGET = 1.5  # TPC-H over the local S3 server at most 1.5x local disk (at SF 10)
Q6_TARGET = 1.2  # Q6 fetches at most 1.2x the bytes of the columns it references


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def requests_text(counts: dict[str, int] | None) -> str:
    """A query's requests to the store: GET / HEAD / LIST ('-': not counted, moto logs none)."""
    return "-" if counts is None else f"{counts['get']} GET, {counts['head']} HEAD, {counts['list']} LIST"


def lake_markdown(r: dict) -> str:
    up, st = r["upload"], r["store"]
    lines = [
        f"# Lake: TPC-H SF {r['sf']:g} on S3-compatible storage ({st['name']} {st['version']} on loopback) "
        "vs local disk",
        "",
        f"{up['objects']} objects, {_mb(up['bytes'])}, uploaded in {up['s']:.1f} s "
        f"({up['mb_per_s']:.0f} MB/s). The store's own speed through pyarrow's S3 client, on the "
        f"largest object ({_mb(st['object_bytes'])}), medians: whole GET {st['whole_get_mb_s']:.0f} MB/s, "
        f"4 MB range GETs {st['range_4mb_get_mb_s']:.0f} MB/s, a 64 KB range GET "
        f"{st['range_64kb_get_ms']:.2f} ms. Machine: {r['machine'].get('cores')} cores, "
        f"load at start {r['machine'].get('load_average_at_start')}. Wall {r['wall_s']:.0f} s.",
        "",
    ]
    if "tpch" in r:
        lines += _tpch(r)
    if "pushdown" in r:
        lines += _pushdown(r["pushdown"])
    if "exchange" in r:
        lines += exchange_markdown(r["exchange"])
    return "\n".join(lines)


def _tpch(r: dict) -> list[str]:
    lines = []
    for n in sorted({p["ranks"] for p in r["tpch"]}):
        pts = [p for p in r["tpch"] if p["ranks"] == n]
        s3, local = sum(p["s3_s"] for p in pts), sum(p["local_s"] for p in pts)
        d_s3, d_local = (sum(p.get(k, 0) for p in pts) for k in ("duckdb_s3_s", "duckdb_local_s"))
        verdict = "met" if s3 / local <= S3_TARGET else "not met"
        alone = f" DuckDB alone: {d_s3:.2f} s vs {d_local:.2f} s = {d_s3 / d_local:.2f}x." if d_local else ""
        c_s3, c_server, c_local = (sum(p.get(k, 0) for p in pts) for k in CPU_KEYS)
        if c_local:
            alone += (
                f" CPU: ranks {c_s3:.1f} s and the S3 server {c_server:.1f} s over objects, ranks "
                f"{c_local:.1f} s over files: the server alone adds {c_server / c_local:.0%} to the "
                "CPU the query needs over files, on the cores the ranks use (ranks' CPU includes "
                "their polling while they wait)."
            )
        lines += [
            f"## TPC-H, {n} ranks: objects {s3:.2f} s vs local files {local:.2f} s = {s3 / local:.2f}x "
            f"(target <= {S3_TARGET}x at SF 10: {verdict} at SF {r['sf']:g})",
            "",
            f"Medians of {r['runs']} runs after a checked warm-up of each.{alone} DuckDB alone reads the "
            "objects through the same adapter and server: what the store allows any engine here.",
            "",
            "| query | S3 s | local s | ratio | CPU s: ranks + server (S3) | local | server / local "
            "| DuckDB S3 s | DuckDB local s | DuckDB ratio | correct "
            "| requests (one run) | DuckDB's requests |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---|---|",
        ]
        lines += [
            f"| Q{p['query']:02d} | {p['s3_s']:.3f} | {p['local_s']:.3f} | {p['ratio']:.2f}x "
            f"| {p.get('cpu_s3_s', 0):.2f} + {p.get('cpu_server_s', 0):.2f} | {p.get('cpu_local_s', 0):.2f} "
            f"| {_cpu_ratio(p)} "
            f"| {p.get('duckdb_s3_s', 0):.3f} | {p.get('duckdb_local_s', 0):.3f} "
            f"| {p.get('duckdb_ratio', 0):.2f}x "
            f"| {'yes' if p['correct'] else 'NO'} "
            f"| {requests_text(p.get('requests'))} | {requests_text(p.get('duckdb_requests'))} |"
            for p in pts
        ]
        lines.append("")
    return lines


CPU_KEYS = ("cpu_s3_s", "cpu_server_s", "cpu_local_s")


def _cpu_ratio(p: dict) -> str:
    _, server, local = (p.get(k, 0) for k in CPU_KEYS)
    return f"{server / local:.0%}" if local else "-"


def _pushdown(pd: dict) -> list[str]:
    lines = [
        f"## Bytes fetched from the store ({pd['ranks']} ranks, one profiled run each)",
        "",
        "Without pushdown: a scan of every column of the tables the query reads (nothing to push). "
        "Its columns: the compressed bytes of the columns it references, footers included.",
        "",
        "| query | fetched | without pushdown | its columns | fetched / its columns | scans |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for q in pd["queries"]:
        scans = "; ".join(s["describe"] for s in q["scans"])
        lines.append(
            f"| Q{q['query']} | {_mb(q['fetched'])} | {_mb(q['unpushed_fetched'])} "
            f"| {_mb(q['referenced_bytes'])} "
            f"| {q['vs_referenced']:.2f}x | {scans} |"
        )
    q6 = next(q for q in pd["queries"] if q["query"] == 6)
    s = pd["sorted"]
    best = min(q6["vs_referenced"], s["vs_referenced"])
    lines += [
        "",
        f"Q6 target (<= {Q6_TARGET}x its columns' bytes): {q6['vs_referenced']:.2f}x as generated, "
        f"{s['vs_referenced']:.2f}x sorted by l_shipdate: {'met' if best <= Q6_TARGET else 'not met'}.",
        "",
        f"Q6 over lineitem sorted by l_shipdate ({s['object_count']} objects, "
        f"written in {s['write_s']:.1f} s): "
        f"{s['describe']}; its columns {_mb(s['referenced_bytes'])}; {s['s']:.3f} s; "
        f"correct: {'yes' if s['correct'] else 'NO'}.",
        "",
    ]
    return lines


def _save(fig, path: Path) -> Path:  # type: ignore[no-untyped-def]
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def lake_figures(r: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    if "tpch" in r:
        fig, ax = plt.subplots(figsize=(11, 4))
        ranks = sorted({p["ranks"] for p in r["tpch"]})
        width = 0.8 / len(ranks)
        for i, n in enumerate(ranks):
            pts = [p for p in r["tpch"] if p["ranks"] == n]
            ax.bar(
                [p["query"] + i * width for p in pts], [p["ratio"] for p in pts], width, label=f"{n} ranks"
            )
        ax.axhline(S3_TARGET, color="red", linewidth=0.8, linestyle="--", label=f"target {S3_TARGET}x")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(1, 23), [f"Q{q}" for q in range(1, 23)])
        ax.set_ylabel("time on objects / local files")
        ax.set_title(f"TPC-H SF {r['sf']:g} over {r['store']['name']} (S3) vs local disk")
        ax.legend()
        paths.append(_save(fig, out / "lake_tpch_ratio.png"))
    if "pushdown" in r:
        pd = r["pushdown"]
        labels = [f"Q{q['query']}" for q in pd["queries"]] + ["Q6 sorted"]
        fetched = [q["fetched"] for q in pd["queries"]] + [pd["sorted"]["bytes_fetched"]]
        unpushed = [q["unpushed_fetched"] for q in pd["queries"]] + [
            pd["unpushed"]["lineitem"]["bytes_fetched"]
        ]
        columns = [q["referenced_bytes"] for q in pd["queries"]] + [pd["sorted"]["referenced_bytes"]]
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = range(len(labels))
        for k, (name, values) in enumerate(
            (("without pushdown", unpushed), ("its columns", columns), ("fetched", fetched))
        ):
            ax.bar([x + (k - 1) * 0.27 for x in xs], [v / 1e6 for v in values], 0.27, label=name)
        ax.set_xticks(list(xs), labels)
        ax.set_ylabel("MB")
        ax.set_title(f"Bytes fetched from the store, SF {r['sf']:g}")
        ax.legend()
        paths.append(_save(fig, out / "lake_pushdown_bytes.png"))
    return paths
