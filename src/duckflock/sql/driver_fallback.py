"""Answer on the driver what cannot be distributed: DuckDB runs the user's query text as written
(never re-written by sqlglot), each catalog table it reads gathered whole on rank 0 under its name.
Exact by construction (it is single-process DuckDB on the same rows), so a construct the planner
lacks (recursive CTEs, PIVOT, SAMPLE, ...) costs speed, never correctness; above a size limit the
query is refused instead.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from duckflock.catalog import Catalog
from duckflock.errors import SqlError
from duckflock.plan.nodes import DriverQuery, Scan


def on_driver(text: str, catalog: Catalog, width: int, reason: str, limit_bytes: int) -> DriverQuery:
    """A DriverQuery for ``text`` (whose result has ``width`` columns), or SqlError naming
    ``reason`` when the tables it reads are larger than ``limit_bytes``."""
    try:
        tree = sqlglot.parse_one(text, read="duckdb")
    except SqlglotError:
        raise SqlError(reason) from None
    inputs: list[tuple[str, Scan]] = []
    total = 0
    # Every catalog table the text names, also where a CTE of that name may shadow it: which one a
    # name means depends on scope (a CTE's own body reads the table), and a table gathered in vain
    # costs only time.
    for table in tree.find_all(exp.Table):
        info = catalog.find(table.name) if isinstance(table.this, exp.Identifier) else None
        if info is not None and table.args.get("db"):
            # Each table becomes a temporary view of its name there (exec/stage.py), which a
            # schema-qualified name does not reach.
            raise SqlError(f"{reason}; on the driver, name the table {info.name} without a schema")
        if info is None or any(t == info.name for t, _ in inputs):
            continue
        cols = tuple(c for c, _ in info.columns)
        inputs.append((info.name, Scan(cols, table=info.name, source_columns=cols)))
        total += info.rows * info.row_width()
    if limit_bytes < 0:
        raise SqlError(f"{reason} (answering such queries on the driver is off: driver_fallback_bytes)")
    if total > limit_bytes:
        raise SqlError(
            f"{reason}; answering it on the driver instead would gather about {total / 1e6:.0f} MB of "
            f"tables, over the {limit_bytes / 1e6:.0f} MB limit (driver_fallback_bytes)"
        )
    columns = tuple(f"__d{i}" for i in range(width))
    return DriverQuery(
        columns, sql=text, inputs=tuple(inputs), reason=reason.removeprefix("unsupported SQL construct: ")
    )
