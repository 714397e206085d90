"""Bytes per value of a table's strings, measured on a sample when the table is written.

Size estimates decide between broadcasting a join side and moving the other one; with every VARCHAR
guessed at the same width, a table of comments looks like a table of flags (TPC-H's ps_comment
averages 124 bytes, n_name 7). Measured on the first rows of one partition: cheap, and only an
estimate is needed.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import duckdb

from duckflock.catalog import TableInfo
from duckflock.catalog.catalog import file_path
from duckflock.plan.sql_text import read_table_files
from duckflock.sqltext import quote_ident as q

SAMPLE_ROWS = 64 * 1024
OFFSET_BYTES = 4  # an Arrow string's offset next to its bytes


def with_widths(con: duckdb.DuckDBPyConnection, info: TableInfo, root: Path) -> TableInfo:
    """``info`` with the average width of each VARCHAR column, measured in its first non-empty
    partition (unchanged where there is nothing to measure, or it cannot be read)."""
    strings = [name for name, typ in info.columns if typ == "VARCHAR"]
    part = next((p for p in info.partitions if p.rows and p.files), None)
    if not strings or part is None:
        return info
    source = read_table_files(info, [file_path(root, f) for f in part.files])
    sample = f"SELECT {', '.join(q(c) for c in strings)} FROM {source} LIMIT {SAMPLE_ROWS}"
    try:
        averages = con.execute(f"SELECT {', '.join(f'avg(strlen({q(c)}))' for c in strings)} FROM ({sample})")
        row = averages.fetchone() or ()
    except duckdb.Error:
        return info  # only an estimate: the widths by type serve (the table was just written or read)
    widths = tuple((c, OFFSET_BYTES + round(a or 0)) for c, a in zip(strings, row, strict=True))
    return replace(info, widths=widths)
