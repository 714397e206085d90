"""Answer on the driver what cannot be distributed: DuckDB runs the user's query text as written
(never re-written by sqlglot), each catalog table it reads gathered whole on rank 0 under its name.
Exact by construction (it is single-process DuckDB on the same rows), so a construct the planner
lacks (recursive CTEs, PIVOT, SAMPLE, ...) costs speed, never correctness; above a size limit the
query is refused instead.
"""

from __future__ import annotations

import duckdb
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from duckflock.catalog import Catalog
from duckflock.errors import NotDistributed
from duckflock.plan.nodes import DriverQuery, Scan


def on_driver(
    text: str, catalog: Catalog, width: int, refusal: NotDistributed, limit_bytes: int
) -> DriverQuery:
    """A DriverQuery for ``text`` (whose result has ``width`` columns), or ``refusal`` (with the
    size) when the tables it reads are larger than ``limit_bytes``. Only a named refusal comes
    here: an error in the planner is a bug, which no other way of answering may hide."""
    inputs: list[tuple[str, Scan]] = []
    total = 0
    # Every catalog table the text names, also where a CTE of that name may shadow it: which one a
    # name means depends on scope (a CTE's own body reads the table), and a table gathered in vain
    # costs only time.
    for name, qualified in _table_names(text):
        info = catalog.find(name)
        if info is not None and qualified:
            # Each table becomes a temporary view of its name there (exec/stages/stage.py), which a
            # schema-qualified name does not reach.
            raise _refused(refusal, f"on the driver, name the table {info.name} without a schema")
        if info is None or any(t == info.name for t, _ in inputs):
            continue
        cols = tuple(c for c, _ in info.columns)
        inputs.append((info.name, Scan(cols, table=info.name, source_columns=cols)))
        total += info.rows * info.row_width()
    if limit_bytes < 0:
        raise NotDistributed(
            f"{refusal} (answering such queries on the driver is off: driver_fallback_bytes)",
            refusal.construct,
        )
    if total > limit_bytes:
        raise _refused(
            refusal,
            f"answering it on the driver instead would gather about {total / 1e6:.0f} MB of "
            f"tables, over the {limit_bytes / 1e6:.0f} MB limit (driver_fallback_bytes)",
        )
    columns = tuple(f"__d{i}" for i in range(width))
    reason = str(refusal).removeprefix("unsupported SQL construct: ")
    return DriverQuery(columns, sql=text, inputs=tuple(inputs), reason=reason, construct=refusal.construct)


def _refused(refusal: NotDistributed, why: str) -> NotDistributed:
    return NotDistributed(f"{refusal}; {why}", refusal.construct)


def _table_names(text: str) -> list[tuple[str, bool]]:
    """(name, whether a schema qualifies it) of each table the text names: by sqlglot's parse, or
    by DuckDB's parser for text sqlglot cannot read."""
    try:
        tree = sqlglot.parse_one(text, read="duckdb")
    except SqlglotError:
        plain = duckdb.get_table_names(text)
        named = [q.split(" AS ")[0] for q in duckdb.get_table_names(text, qualified=True)]
        return [(n, any(q.endswith("." + n) for q in named)) for n in sorted(plain)]
    return [
        (t.name, bool(t.args.get("db")))
        for t in tree.find_all(exp.Table)
        if isinstance(t.this, exp.Identifier)
    ]
