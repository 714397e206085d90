"""Splitting aggregates into a partial phase (before the shuffle) and a final phase (after it).

HyPer's pre-aggregation: each rank reduces its rows to one per group before anything crosses the
network. Only aggregates whose partial states combine exactly are split; others shuffle raw rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from duckflock.catalog.partitioning import quote_ident as q


@dataclass(frozen=True)
class Split:
    partial: tuple[tuple[str, str], ...]  # (column, aggregate SQL over the input rows)
    final: tuple[tuple[str, str], ...]  # (column, aggregate SQL over the partial columns)
    result: tuple[str, ...]  # expression over the final columns giving each original aggregate


def split_aggregates(aggs: tuple[str, ...], fresh) -> Split | None:
    """Partial/final decomposition, or None when some aggregate does not decompose."""
    partial: list[tuple[str, str]] = []
    final: list[tuple[str, str]] = []
    result: list[str] = []

    def add(partial_sql: str, final_fn: str) -> str:
        p = fresh("p")
        f = fresh("f")
        partial.append((p, partial_sql))
        final.append((f, f"{final_fn}({q(p)})"))
        return f

    for sql in aggs:
        node = sqlglot.parse_one(sql, read="duckdb")
        if node.args.get("distinct") or isinstance(node.this, exp.Distinct):
            return None
        arg = node.this.sql(dialect="duckdb") if node.this is not None else None
        if isinstance(node, exp.Count):
            f = add(f"COUNT({arg or '*'})", "SUM")
            result.append(f"CAST(COALESCE({q(f)}, 0) AS BIGINT)")
        elif isinstance(node, exp.Sum):
            f = add(f"SUM({arg})", "SUM")
            result.append(q(f))
        elif isinstance(node, exp.Min | exp.Max):
            fn = "MIN" if isinstance(node, exp.Min) else "MAX"
            result.append(q(add(f"{fn}({arg})", fn)))
        elif isinstance(node, exp.Avg):
            s = add(f"SUM({arg})", "SUM")
            c = add(f"COUNT({arg})", "SUM")
            result.append(f"CAST({q(s)} AS DOUBLE) / NULLIF({q(c)}, 0)")
        else:
            return None
    return Split(tuple(partial), tuple(final), tuple(result))
