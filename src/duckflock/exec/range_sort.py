"""Splitters for a parallel sort: every rank samples its sort keys, all ranks see all samples and pick
the same ``size - 1`` splitters, and each row's target rank is the number of splitters it sorts after.

No library computes a lexicographic "sorts after" for ORDER BY keys with mixed ASC/DESC and NULLS
FIRST/LAST, so it is written out here as SQL for DuckDB to evaluate.
"""

from __future__ import annotations

import pyarrow as pa
import sqlglot

from duckflock.exec.runtime import Runtime

SAMPLE_ROWS_PER_RANK = 4096


def _keys(keys: tuple[str, ...]) -> list[tuple[str, bool, bool]]:
    """(expression SQL, descending, nulls first) for each ORDER BY key."""
    out = []
    for key in keys:
        ordered = sqlglot.parse_one(f"SELECT 1 ORDER BY {key}", read="duckdb").args["order"].expressions[0]
        out.append(
            (
                ordered.this.sql(dialect="duckdb"),
                bool(ordered.args.get("desc")),
                bool(ordered.args.get("nulls_first")),
            )
        )
    return out


def _literal(value: object, duckdb_type: str) -> str | None:
    if value is None:
        return None
    text = repr(value) if isinstance(value, float) else str(value)
    return f"CAST('{text.replace(chr(39), chr(39) * 2)}' AS {duckdb_type})"


def _after(row: list[tuple[str, bool, bool]], splitter: list[str | None]) -> str:
    """SQL that is true when the row sorts strictly after the splitter."""
    clause = "FALSE"
    for (expr, desc, nulls_first), s in reversed(list(zip(row, splitter, strict=True))):
        if s is None:
            gt = f"({expr} IS NOT NULL)" if nulls_first else "FALSE"
            eq = f"({expr} IS NULL)"
        else:
            op = "<" if desc else ">"
            gt = (
                f"({expr} IS NOT NULL AND {expr} {op} {s})"
                if nulls_first
                else f"({expr} IS NULL OR {expr} {op} {s})"
            )
            eq = f"COALESCE({expr} = {s}, FALSE)"
        clause = f"({gt} OR ({eq} AND {clause}))"
    return clause


def target_sql(rt: Runtime, qid: int, table: str, keys: tuple[str, ...]) -> str:
    """SQL computing each row's target rank; a collective: every rank must call it."""
    parsed = _keys(keys)
    exprs = ", ".join(f"{e} AS k{i}" for i, (e, _, _) in enumerate(parsed))
    sample = rt.con.sql(
        f"SELECT {exprs} FROM {table} USING SAMPLE reservoir({SAMPLE_ROWS_PER_RANK} ROWS) REPEATABLE (7)"
    ).to_arrow_table()
    gathered = [t for t in rt.mux.allgather(qid, sample) if t.num_rows]
    if not gathered or rt.size == 1:
        return "CAST(0 AS USMALLINT)"
    samples = pa.concat_tables(gathered)
    rt.con.register("__samples", samples)
    try:
        order = ", ".join(
            f"k{i}{' DESC' if d else ''}{' NULLS FIRST' if nf else ' NULLS LAST'}"
            for i, (_, d, nf) in enumerate(parsed)
        )
        ordered = rt.con.sql(f"SELECT * FROM __samples ORDER BY {order}")
        types = [str(t) for t in ordered.types]
        rows = ordered.fetchall()
    finally:
        rt.con.unregister("__samples")
    picks = [rows[(i * len(rows)) // rt.size] for i in range(1, rt.size)]
    whens = []
    for target in range(rt.size - 1, 0, -1):
        splitter = [_literal(v, t) for v, t in zip(picks[target - 1], types, strict=True)]
        whens.append(f"WHEN {_after(parsed, splitter)} THEN {target}")
    return f"CAST(CASE {' '.join(whens)} ELSE 0 END AS USMALLINT)"
