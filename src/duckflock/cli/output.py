"""Printing results and profiles with rich."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.table import Table

from duckflock.units import human

if TYPE_CHECKING:
    from duckflock.plan.stages import OnDriver


def stdout_console() -> Console:
    """Wide when not a terminal, so tables written to files or pipes are not squeezed."""
    return Console(width=None if sys.stdout.isatty() else 160)


def print_profile(stats, console: Console | None = None, on_driver: OnDriver | None = None) -> None:
    """Per rank and stage: the breakdown of the seed report's tables 2-4, and more; ``on_driver``:
    why the query ran whole on the driver, when it did."""
    console = console or Console()
    if on_driver is not None:
        console.print(f"the query {on_driver.describe()}", highlight=False, markup=False)
    view = Table(
        title="profile per rank and stage (milliseconds)",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    heads = (
        "rank",
        "stage",
        "duckdb",
        "split",
        "encode",
        "send",
        "recv",
        "total",
        "rows out",
        "sent",
        "rows in",
        "recvd",
        "in memory",
        "spilled",
    )
    for col in heads:
        view.add_column(col, justify="right", no_wrap=True)
    for s in sorted(stats, key=lambda s: (s.rank, s.sid)):
        e = s.exchange
        ms = [
            f"{1000 * v:.1f}"
            for v in (s.compute_s, e.partition_s, e.serialize_s, e.send_wait_s, e.recv_wait_s, s.total_s)
        ]
        view.add_row(
            str(s.rank),
            str(s.sid),
            *ms,
            f"{e.rows_out:,}",
            human(e.bytes_out, "B"),
            f"{e.rows_in:,}",
            human(e.bytes_in, "B"),
            human(e.bytes_kept, "B"),
            human(e.bytes_spilled, "B"),
        )
    console.print(view)
    for rank in sorted({s.rank for s in stats}):
        mine = [s.exchange for s in stats if s.rank == rank]
        kept, spilled = sum(e.bytes_kept for e in mine), sum(e.bytes_spilled for e in mine)
        if kept or spilled:
            kept_s, spilled_s = human(kept, "B"), human(spilled, "B")
            console.print(
                f"rank {rank}: received data kept in memory {kept_s}, spilled {spilled_s}", highlight=False
            )
    for s in sorted(stats, key=lambda s: (s.rank, s.sid)):
        if s.note:
            console.print(f"rank {s.rank} stage {s.sid}: {s.note}", highlight=False)
    for s in sorted(stats, key=lambda s: (s.rank, s.sid)):
        for scan in getattr(s, "scans", ()):
            console.print(f"rank {s.rank} stage {s.sid} scan {scan.describe()}", highlight=False)
    console.print(
        "duckdb: DuckDB producing the stage's rows (scan, filter, join, aggregate, sort) | split: rows by "
        "target | encode: Arrow IPC | send: waiting on back-pressure or a streaming consumer's credit | "
        "recv: waiting for and receiving inputs (on the driver's last stage: collecting the result) | "
        "sent/recvd: bytes on the wire | "
        "in memory / spilled: received bytes kept in memory within the rank's budget for received data "
        "(exec/resources/budget.py) / written to local files past it | "
        "scan: files (objects) read of the rank's share after hive pruning, Parquet row groups DuckDB "
        "scanned of those files' (the rest skipped by their statistics), bytes read of the share",
        highlight=False,
    )
