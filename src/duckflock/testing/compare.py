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


def _sortable(v: object) -> object:
    # Floats are rounded for sorting only, so rows whose floats differ in the last bits pair up;
    # NaN sorts after every number (as in DuckDB), not among them, so that it pairs with NaN;
    # nested values (structs, lists, maps) sort by their text.
    if isinstance(v, float):
        return (1, 0.0) if math.isnan(v) else (0, round(v, 6))
    if isinstance(v, dict | list | tuple):
        return repr(v)
    return v


def _key(row: tuple) -> tuple:
    return tuple((v is None, str(type(v)), _sortable(v) if v is not None else 0) for v in row)


def _same(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return _close(a, b)


def difference(
    got: pa.Table, want: pa.Table, order_by: list[str] | None = None, in_order: bool = False
) -> str | None:
    """None when equal: same column names and types, the same rows as multisets, and with
    ``order_by`` the same sequence of those columns (``in_order``: of whole rows). Otherwise
    what differs."""
    if got.column_names != want.column_names:
        return f"columns {got.column_names} != {want.column_names}"
    if got.schema.types != want.schema.types:
        return f"types {got.schema.types} != {want.schema.types}"
    if got.num_rows != want.num_rows:
        return f"{got.num_rows} rows != {want.num_rows}"
    got_rows, want_rows = _rows(got), _rows(want)
    for rg, rw in zip(sorted(got_rows, key=_key), sorted(want_rows, key=_key), strict=True):
        if not _same(rg, rw):
            return f"row {rg} != {rw}"
    if in_order:
        for i, (rg, rw) in enumerate(zip(got_rows, want_rows, strict=True)):
            if not _same(rg, rw):
                return f"row {i} in order: {rg} != {rw}"
    for c in order_by or []:
        g, w = got.column(c).to_pylist(), want.column(c).to_pylist()
        if not all(_close(a, b) for a, b in zip(g, w, strict=True)):
            return f"order of {c} differs"
    return None


def same_result(got: pa.Table, want: pa.Table, order_by: list[str] | None = None) -> bool:
    """``difference`` as a yes or no. Arrow's exact comparison first: it is fast, while the tolerant
    one compares Python rows and is slow on large results, so it runs only when the exact one fails."""
    if got.schema == want.schema and got.num_rows == want.num_rows:
        keys = [(c, "ascending") for c in got.column_names]
        in_order = all(got.column(c).equals(want.column(c)) for c in order_by or [])
        if in_order and got.sort_by(keys).equals(want.sort_by(keys)):
            return True
    return difference(got, want, order_by) is None
