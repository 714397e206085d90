"""Is a distributed result the one single-process DuckDB gives? Exact for integers, strings, dates
and decimals; floating point within 1e-9 relative (partial sums add in another order)."""

from __future__ import annotations

import math

import pyarrow as pa


def _rows(t: pa.Table) -> list[tuple]:
    cols = [c.to_pylist() for c in t.columns]
    return [tuple(r) for r in zip(*cols, strict=True)] if cols else []


def _close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) and math.isnan(b):
            return True
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _key(row: tuple) -> tuple:
    # Floats are rounded for sorting only, so rows whose floats differ in the last bits pair up.
    return tuple((v is None, str(type(v)), round(v, 6) if isinstance(v, float) else v) for v in row)


def difference(got: pa.Table, want: pa.Table, order_by: list[str] | None = None) -> str | None:
    """None when equal: same column names and types, the same rows as multisets, and with
    ``order_by`` the same sequence of those columns. Otherwise what differs."""
    if got.column_names != want.column_names:
        return f"columns {got.column_names} != {want.column_names}"
    if got.schema.types != want.schema.types:
        return f"types {got.schema.types} != {want.schema.types}"
    if got.num_rows != want.num_rows:
        return f"{got.num_rows} rows != {want.num_rows}"
    for rg, rw in zip(sorted(_rows(got), key=_key), sorted(_rows(want), key=_key), strict=True):
        if not all(_close(a, b) for a, b in zip(rg, rw, strict=True)):
            return f"row {rg} != {rw}"
    for c in order_by or []:
        g, w = got.column(c).to_pylist(), want.column(c).to_pylist()
        if not all(_close(a, b) for a, b in zip(g, w, strict=True)):
            return f"order of {c} differs"
    return None
