"""``duckflock bench model --nodes ...``: the model's projection to many nodes and larger data.

The counts are those ``--validate`` measured (per query, at its largest rank count), scaled to the
scale factors asked for and split over N nodes (model.project); the constants are this machine's
per-thread rates times ``--cores-per-node``, with the network's bandwidth and per-message latency.
"""

from __future__ import annotations

import re
from pathlib import Path

from duckflock.errors import DuckflockError
from duckflock_bench.model import GB, Constants, Counts, project

PHASES = ("scan", "operators", "partition", "network", "final", "overhead")
_RATE = re.compile(r"(?i)^\s*([\d.]+)\s*(g|m|t)(bit|b)(?:/s|ps)?\s*$")


def parse_rate(text: str) -> float:
    """``100Gbit/s`` -> 12.5 (GB/s); also ``25gbit``, ``10GB/s``, ``400Mbit/s``."""
    m = _RATE.match(text)
    if not m:
        raise DuckflockError(f"--network takes rates like 100Gbit/s or 10GB/s, not {text!r}")
    value = float(m.group(1)) * {"m": 1e-3, "g": 1.0, "t": 1e3}[m.group(2).lower()]
    return value / 8 if m.group(3).lower() == "bit" else value


def reference_counts(validation: dict) -> dict[str, tuple[int, list[Counts]]]:
    """Per query: the counts of its run on the most ranks, and the number of its stages."""
    out: dict[str, tuple[int, list[Counts]]] = {}
    best: dict[str, int] = {}
    for p in validation["points"]:
        if p["ranks"] >= best.get(p["query"], 0):
            best[p["query"]] = p["ranks"]
            out[p["query"]] = (p["stages"], [Counts(**c) for c in p["counts"]])
    return out


def run_projection(
    validation: dict,
    consts: dict[str, float],
    nodes: list[int],
    networks: list[str],
    sfs: list[float],
    cores: int,
    latency_s: float,
) -> dict:
    measured_sf = float(validation["sf"])
    points = []
    for name, (stages, counts) in reference_counts(validation).items():
        for net in networks:
            k = Constants.from_calibration(consts, net_gbps=parse_rate(net), latency_s=latency_s)
            for sf in sfs:
                one = project(counts, k, sf / measured_sf, 1, cores, stages)
                for n in [1, *nodes]:
                    pr = one if n == 1 else project(counts, k, sf / measured_sf, n, cores, stages)
                    points.append(
                        {
                            "query": name,
                            "network": net,
                            "sf": sf,
                            "nodes": n,
                            "phases": pr.phases,
                            "speedup": one.phases["total"] / pr.phases["total"],
                            "pair_bytes": pr.pair_bytes,
                            "broadcast_bytes": pr.broadcast_bytes,
                            "replanned": pr.replanned,
                            "dominant": max(PHASES, key=lambda p, pr=pr: pr.phases[p]),
                        }
                    )
    return {
        "measured_sf": measured_sf,
        "overhead_per_rank_s": consts["overhead_per_rank_s"],
        "cores_per_node": cores,
        "latency_s": latency_s,
        "networks": networks,
        "nodes": nodes,
        "sfs": sfs,
        "points": points,
    }


def _size(nbytes: float) -> str:
    for unit, div in (("GB", GB), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= div:
            return f"{nbytes / div:.1f} {unit}"
    return f"{nbytes:.0f} B"


def projection_markdown(proj: dict) -> str:
    lines = [
        f"## Projection: {proj['cores_per_node']} cores per node, {proj['latency_s'] * 1e6:.0f} µs per "
        f"message, {proj['overhead_per_rank_s'] * 1e3:.2f} ms per node on the driver, counts measured at "
        f"SF {proj['measured_sf']:g}",
        "",
        "Seconds per phase (per node, slowest), speedup over one node of the same kind, the largest "
        "per-pair message of a shuffle, the bytes each node receives by broadcasts, the largest phase, "
        "the stages whose replicated or broadcast inputs outgrow the broadcast threshold at that scale "
        "(hashed instead, as the planner would).",
    ]
    keys = sorted({(p["query"], p["network"], p["sf"]) for p in proj["points"]}, key=str)
    for query, net, sf in keys:
        pts = [p for p in proj["points"] if (p["query"], p["network"], p["sf"]) == (query, net, sf)]
        lines += [
            "",
            f"### {query}, SF {sf:g}, {net}",
            "",
            "| nodes | " + " | ".join(PHASES) + " | total s | speedup | per pair | broadcast | largest "
            "| hashed instead |",
            "|---:|" + "---:|" * len(PHASES) + "---:|---:|---:|---:|---|---|",
        ]
        for p in pts:
            ph = p["phases"]
            lines.append(
                f"| {p['nodes']} | "
                + " | ".join(f"{ph[x]:.3g}" for x in PHASES)
                + f" | {ph['total']:.3g} | {p['speedup']:.1f}x | {_size(p['pair_bytes'])} "
                f"| {_size(p['broadcast_bytes'])} | {p['dominant']} "
                f"| {', '.join(f'stage {s}' for s in p['replanned']) or '-'} |"
            )
    return "\n".join(lines) + "\n"


def projection_figures(proj: dict, docs: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs.mkdir(parents=True, exist_ok=True)
    queries = sorted({p["query"] for p in proj["points"]})
    fig, axes = plt.subplots(1, len(queries), figsize=(3.2 * len(queries), 3.4), sharey=True, squeeze=False)
    for ax, q in zip(axes[0], queries, strict=True):
        for net in proj["networks"]:
            for sf in proj["sfs"]:
                pts = [p for p in proj["points"] if (p["query"], p["network"], p["sf"]) == (q, net, sf)]
                xs, ys = [p["nodes"] for p in pts], [p["speedup"] for p in pts]
                ax.plot(xs, ys, marker="o", label=f"SF {sf:g}, {net}")
        n = [1, *proj["nodes"]]
        ax.plot(n, n, color="grey", linestyle=":", linewidth=0.8, label="linear")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_title(q)
        ax.set_xlabel("nodes")
    axes[0][0].set_ylabel("speedup over 1 node")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(f"Projected speedup ({proj['cores_per_node']} cores per node)")
    fig.tight_layout()
    speedup = docs / "model_speedup.png"
    fig.savefig(speedup, dpi=110)
    plt.close(fig)

    sf = max(proj["sfs"])
    nets = proj["networks"]
    size = (3.2 * len(queries), 3.0 * len(nets))
    fig, axes = plt.subplots(len(nets), len(queries), figsize=size, squeeze=False)
    for row, net in zip(axes, nets, strict=True):
        for ax, q in zip(row, queries, strict=True):
            pts = [p for p in proj["points"] if (p["query"], p["network"], p["sf"]) == (q, net, sf)]
            labels = [str(p["nodes"]) for p in pts]
            totals = [p["phases"]["total"] for p in pts]
            bottom = [0.0] * len(pts)
            for phase in PHASES:  # each phase's share of the time, the total above the bar
                vals = [p["phases"][phase] / t for p, t in zip(pts, totals, strict=True)]
                ax.bar(labels, vals, bottom=bottom, label=phase)
                bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
            for x, t in enumerate(totals):
                ax.text(x, 1.02, f"{t:.2g} s", ha="center", fontsize=7)
            ax.set_ylim(0, 1.12)
            ax.set_title(f"{q}, {net}", fontsize=9)
            ax.set_xlabel("nodes")
        row[0].set_ylabel("share of the time")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(f"Projected time per phase (share, total above), SF {sf:g}")
    fig.tight_layout()
    phases = docs / "model_phases.png"
    fig.savefig(phases, dpi=110)
    plt.close(fig)
    return [speedup, phases]


def validation_figure(validation: dict, docs: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 4.5))
    for ranks in sorted({p["ranks"] for p in validation["points"]}):
        pts = [p for p in validation["points"] if p["ranks"] == ranks]
        xs = [p["measured"]["total"] for p in pts]
        ax.scatter(xs, [p["predicted"]["total"] for p in pts], label=f"{ranks} ranks")
        for p, x in zip(pts, xs, strict=True):
            ax.annotate(p["query"], (x, p["predicted"]["total"]), fontsize=7)
    lo = min(min(p["measured"]["total"], p["predicted"]["total"]) for p in validation["points"]) * 0.8
    hi = max(max(p["measured"]["total"], p["predicted"]["total"]) for p in validation["points"]) * 1.2
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
    band = {"color": "grey", "alpha": 0.2, "label": "±25%"}
    ax.fill_between([lo, hi], [lo * 0.75, hi * 0.75], [lo * 1.25, hi * 1.25], **band)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured s")
    ax.set_ylabel("predicted s")
    ax.set_title(f"Model vs measurement, TPC-H SF {validation['sf']:g}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = docs / "model_validation.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
