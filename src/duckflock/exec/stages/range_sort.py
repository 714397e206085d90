"""Splitters for a parallel sort: every rank samples its sort keys, all ranks see all samples and pick
the same ``size - 1`` splitters, and each row's target rank is the number of splitters it sorts after.

No library computes a lexicographic "sorts after" for ORDER BY keys with mixed ASC/DESC and NULLS
FIRST/LAST, so it is written out as SQL for DuckDB to evaluate (``catalog/placement.py``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from duckflock.arrays import null_mask, numpy_view
from duckflock.catalog.placement import (
    SPLITTERS_TABLE,
    SortKey,
    choose_splitters,
    one_target,
    quantile_picks,
    sort_key_sample,
    splitter_target_sql,
)
from duckflock.exec.resources.runtime import Runtime

SAMPLE_ROWS_PER_RANK = 4096
_FAST_TYPES = (
    pa.types.is_integer,
    pa.types.is_floating,
    pa.types.is_date,
    pa.types.is_timestamp,
    pa.types.is_decimal,
    pa.types.is_boolean,
)


def _as_numbers(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(values, null mask) of a key column in a numpy type that orders like DuckDB orders the key.
    Decimals become doubles: not exact, but monotone, which is all bucketing needs."""
    t = column.type
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        column = column.cast(pa.int64() if not pa.types.is_date32(t) else pa.int32())
    elif pa.types.is_decimal(t) or pa.types.is_boolean(t):
        column = column.cast(pa.float64())
    nulls = null_mask(column)
    values = numpy_view(pc.fill_null(column, 0) if column.null_count else column)
    return values, nulls


def fast_targets(rt: Runtime, qid: int, table: pa.Table, keys: tuple[str, ...]) -> np.ndarray | None:
    """Targets for one plain numeric/date key column, computed with numpy; None when the keys need
    the general SQL path. A collective when it returns an array: every rank takes the same path,
    since the decision depends only on the plan and the (common) schema."""
    parsed = sort_keys(keys)
    if len(parsed) != 1:
        return None
    expr, desc, nulls_first = parsed[0]
    name = expr[1:-1] if expr.startswith('"') and expr.endswith('"') else None
    if name is None or name not in table.column_names:
        return None
    if not any(check(table.schema.field(name).type) for check in _FAST_TYPES):
        return None
    values, nulls = _as_numbers(table.column(name))
    valid = values[~nulls]
    rng = np.random.default_rng(7 + rt.rank)
    sample = (
        valid[rng.choice(len(valid), min(len(valid), SAMPLE_ROWS_PER_RANK), replace=False)]
        if len(valid)
        else valid
    )
    gathered = [(n, np.asarray(a)) for n, a in rt.mux.allgather(qid, (len(valid), sample)) if len(a)]
    if not gathered or rt.size == 1:
        return np.zeros(table.num_rows, dtype=np.uint16)
    # The weighted quantiles of catalog/placement.py, on numbers sorted by numpy.
    merged = np.concatenate([a for _, a in gathered])
    weights = np.concatenate([np.full(len(a), n / len(a)) for n, a in gathered])
    order = np.argsort(merged, kind="stable")
    splitters = merged[order][quantile_picks(weights[order], rt.size)]
    if desc:
        buckets = (rt.size - 1) - np.searchsorted(splitters, values, side="right")
    else:
        buckets = np.searchsorted(splitters, values, side="left")
    buckets[nulls] = 0 if nulls_first else rt.size - 1
    return buckets.astype(np.uint16)


def sort_keys(keys: tuple[str, ...]) -> list[SortKey]:
    """(expression SQL, descending, nulls first) for each ORDER BY key."""
    import sqlglot  # only when sorting: keeps sqlglot out of ranks that never need it

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


def target_sql(rt: Runtime, qid: int, table: str, keys: tuple[str, ...]) -> str:
    """SQL computing each row's target rank; a collective: every rank must call it. The splitters
    are registered as the table ``SPLITTERS_TABLE`` (one row per splitter, in their exact types),
    which the SQL reads: no value is written out as text."""
    parsed = sort_keys(keys)
    sampled = rt.con.sql(sort_key_sample(table, parsed, SAMPLE_ROWS_PER_RANK))
    if any(_nested(str(t)) for t in sampled.types):
        # NULLs inside structs and lists order by rules no comparison operator reproduces:
        # sort on one rank rather than risk a wrong order.
        return one_target()
    sample = sampled.to_arrow_table()
    rows = rt.con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
    gathered = [(n, t) for n, t in rt.mux.allgather(qid, (rows, sample)) if t.num_rows]
    if not gathered or rt.size == 1:
        return one_target()
    splitters = choose_splitters(rt.con, gathered, parsed, rt.size)
    rt.con.register(SPLITTERS_TABLE, splitters)
    # Nulls from Arrow's validity, not from Python values: a DATE or TIMESTAMP of infinity has none.
    nulls = [splitters.column(f"k{i}").is_null().to_pylist() for i in range(len(parsed))]
    null_keys = [[key[r] for key in nulls] for r in range(splitters.num_rows)]
    return splitter_target_sql(parsed, null_keys)


def _nested(duckdb_type: str) -> bool:
    return duckdb_type.endswith("]") or duckdb_type.startswith(("STRUCT", "MAP", "UNION"))
