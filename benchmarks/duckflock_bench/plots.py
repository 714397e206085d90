"""PNG figures of the benchmark results (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

PHASE_COLORS = {
    "overhead": "#9e9e9e",
    "compute": "#1f77b4",
    "exchange": "#ff7f0e",
    "wait": "#d62728",
    "final": "#2ca02c",
}
EXCHANGE_PARTS = {
    "max_partition_s": ("partition", "#8c564b"),
    "max_serialize_s": ("serialize", "#e377c2"),
    "max_send_wait_s": ("send wait", "#bcbd22"),
    "max_recv_wait_s": ("recv wait", "#17becf"),
}


def _entries(results: dict) -> list[dict]:
    return [e for e in results["scale_factors"] if e["points"]]


def _axes(n: int, width: float = 4.6, height: float = 3.8):
    n = max(n, 1)
    fig, axes = plt.subplots(1, n, figsize=(max(6.5, width * n), height), squeeze=False)
    return fig, list(axes[0])


def stacked_bars(ax, labels: list[str], layers: list[tuple[str, str, list[float]]]) -> None:
    bottom = [0.0] * len(labels)
    for name, color, values in layers:
        ax.bar(labels, values, bottom=bottom, color=color, label=name, width=0.6)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]


def _label(ax, entry: dict, ylabel: str) -> None:
    ax.set_title(f"SF {entry['sf']:g}")
    ax.set_xlabel("ranks")
    ax.set_ylabel(ylabel)


def _finish(fig, axes, title: str, path: Path) -> None:
    """The end of every per-scale-factor seed figure: title, one legend, the file."""
    fig.suptitle(title, fontsize=10)
    _side_legend(fig, axes[0])
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _side_legend(fig, ax) -> None:
    """One legend for all panels, right of them (it would hide bars inside a panel)."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.82 if handles else 1, 0.95))


def seed_phases(results: dict, path: Path) -> None:
    entries = _entries(results)
    fig, axes = _axes(len(entries))
    for ax, e in zip(axes, entries, strict=False):
        labels = [str(p["ranks"]) for p in e["points"]]
        layers = [
            (name, color, [p["phases_median_s"][name] for p in e["points"]])
            for name, color in PHASE_COLORS.items()
        ]
        stacked_bars(ax, labels, layers)
        ax.scatter(
            labels,
            [p["duckflock_median_s"] for p in e["points"]],
            color="black",
            marker="_",
            s=400,
            zorder=3,
            label="measured total",
        )
        ax.axhline(
            e["points"][0]["duckdb_median_s"],
            color="black",
            linestyle="--",
            linewidth=1,
            label="DuckDB, 1 process",
        )
        _label(ax, e, "seconds (median)")
    _finish(fig, axes, "Seed query: where the time goes (phases are max over ranks)", path)


def seed_vs_duckdb(results: dict, path: Path) -> None:
    entries = _entries(results)
    fig, axes = _axes(len(entries))
    for ax, e in zip(axes, entries, strict=False):
        points = e["points"]
        labels = [f"{p['ranks']} rank{'s' if p['ranks'] > 1 else ''}" for p in points] + ["DuckDB"]
        duck = [x for p in points for x in p["duckdb_s"]]
        values = [p["duckflock_median_s"] for p in points] + [sorted(duck)[len(duck) // 2]]
        lows = [min(p["duckflock_s"]) for p in points] + [min(duck)]
        highs = [max(p["duckflock_s"]) for p in points] + [max(duck)]
        colors = ["#1f77b4"] * len(points) + ["#ffbf00"]
        ax.bar(
            labels,
            values,
            color=colors,
            width=0.6,
            yerr=[
                [v - lo for v, lo in zip(values, lows, strict=True)],
                [hi - v for v, hi in zip(values, highs, strict=True)],
            ],
            capsize=4,
        )
        for i, p in enumerate(points):
            ax.annotate(
                f"{p['ratio']:.2f}x",
                (i, values[i]),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 3),
                textcoords="offset points",
            )
        ax.set_title(f"SF {e['sf']:g}")
        ax.set_ylabel("seconds (median; bars: min-max)")
    fig.suptitle("Seed query: duckflock vs single-process DuckDB (ratio = duckflock / DuckDB)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def seed_exchange(results: dict, path: Path) -> None:
    entries = _entries(results)
    fig, axes = _axes(len(entries))
    for ax, e in zip(axes, entries, strict=False):
        labels = [str(p["ranks"]) for p in e["points"]]
        layers = [
            (name, color, [p["phases_median_s"][key] for p in e["points"]])
            for key, (name, color) in EXCHANGE_PARTS.items()
        ]
        stacked_bars(ax, labels, layers)
        for i, p in enumerate(e["points"]):
            total = sum(p["phases_median_s"][k] for k in EXCHANGE_PARTS)
            ax.annotate(
                f"{p['bytes_exchanged'] / 1e6:.1f} MB",
                (i, total),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 3),
                textcoords="offset points",
            )
        _label(ax, e, "seconds (median, max over ranks)")
    _finish(fig, axes, "Seed query: the exchange phase (labels: bytes on the wire)", path)


def exchange_throughput(results: dict, path: Path) -> None:
    points = results["points"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    labels = [f"{p['ranks']} ranks" for p in points]
    ax.bar(labels, [p["gbps_median"] for p in points], color="#1f77b4", width=0.5, label="shuffle")
    for i, p in enumerate(points):
        ax.annotate(
            f"{p['gbps_median']:.2f}\n({p['ratio_to_memcpy']:.0%} of memcpy)",
            (i, p["gbps_median"]),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 3),
            textcoords="offset points",
        )
    if points:
        memcpy = points[0]["memcpy_gbps"]
        ax.axhline(memcpy, color="black", linestyle="-", linewidth=1, label=f"memcpy {memcpy:.1f}")
        ax.axhline(memcpy / 2, color="black", linestyle="--", linewidth=1, label="target: 1/2 memcpy")
        p2p = [p["mpi_p2p_gbps"] for p in points if p["mpi_p2p_gbps"]]
        if p2p:
            ax.axhline(p2p[0], color="#d62728", linestyle=":", linewidth=1.5, label=f"MPI p2p {p2p[0]:.1f}")
    ax.set_ylabel("GB/s (median)")
    ax.set_title(f"all-to-all shuffle of {results['gb']:g} GB")
    ax.legend(fontsize=8)
    layers = [
        (name, color, [p["phases_median_s"][key] for p in points])
        for key, (name, color) in EXCHANGE_PARTS.items()
    ]
    stacked_bars(bx, labels, layers)
    bx.scatter(
        labels,
        [p["wall_median_s"] for p in points],
        color="black",
        marker="_",
        s=400,
        zorder=3,
        label="wall time",
    )
    bx.set_ylabel("seconds (median, max over ranks)")
    bx.set_title("phases")
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def seed_figures(results: dict, out: Path) -> list[Path]:
    paths = [out / "seed_phases.png", out / "seed_vs_duckdb.png", out / "seed_exchange.png"]
    for fn, p in zip((seed_phases, seed_vs_duckdb, seed_exchange), paths, strict=True):
        fn(results, p)
    return paths


def exchange_figures(results: dict, out: Path) -> list[Path]:
    path = out / "exchange_gbps.png"
    exchange_throughput(results, path)
    return [path]


def bars_per_query(results: dict, value: str, ylabel: str, title: str, path: Path) -> None:
    """One bar per TPC-H query and rank count of ``results["points"][...][value]``, a line at 1."""
    ranks = sorted({p["ranks"] for p in results["points"]})
    qs = sorted({p["query"] for p in results["points"]})
    fig, ax = plt.subplots(figsize=(11, 4))
    width = 0.8 / max(1, len(ranks))
    for i, r in enumerate(ranks):
        by_query = {p["query"]: p[value] for p in results["points"] if p["ranks"] == r}
        ax.bar([q + i * width for q in qs], [by_query.get(q, 0) for q in qs], width, label=f"{r} ranks")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([q + width * (len(ranks) - 1) / 2 for q in qs], [f"Q{q}" for q in qs])
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
