"""Printing results and profiles with rich."""

from __future__ import annotations

import sys

import pyarrow as pa
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from duckflock.units import human


def stdout_console() -> Console:
    """Wide when not a terminal, so tables written to files or pipes are not squeezed."""
    return Console(width=None if sys.stdout.isatty() else 160)


def print_table(table: pa.Table, max_rows: int = 20, console: Console | None = None) -> None:
    console = console or Console()
    view = Table(show_header=True, header_style="bold")
    for name in table.column_names:
        view.add_column(Text(name))
    for row in table.slice(0, max_rows).to_pylist():
        view.add_row(*(Text("NULL" if v is None else str(v)) for v in row.values()))
    console.print(view)
    more = f" (showing {max_rows})" if table.num_rows > max_rows else ""
    console.print(f"{table.num_rows} row{'' if table.num_rows == 1 else 's'}{more}")


def print_profile(stats, console: Console | None = None) -> None:
    """Per rank and stage: the breakdown of the seed report's tables 2-4, and more."""
    console = console or Console()
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
            human(e.bytes_spilled, "B"),
        )
    console.print(view)
    for s in sorted(stats, key=lambda s: (s.rank, s.sid)):
        if s.note:
            console.print(f"rank {s.rank} stage {s.sid}: {s.note}", highlight=False)
    console.print(
        "duckdb: DuckDB producing the stage's rows (scan, filter, join, aggregate, sort) | split: rows by "
        "target | encode: Arrow IPC | send: waiting on back-pressure or a streaming consumer's credit | "
        "recv: waiting for and receiving inputs (on the driver's last stage: collecting the result) | "
        "sent/recvd: bytes on the wire | "
        "spilled: received bytes written to local files past the stage's memory budget",
        highlight=False,
    )
