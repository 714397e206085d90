"""Is a distributed result the one single-process DuckDB gives? Exact for integers, strings, dates
and decimals; floating point within 1e-9 relative (partial sums add in another order)."""

from __future__ import annotations

import functools
import math

import pyarrow as pa


def _rows(t: pa.Table) -> list[tuple]:
    cols = [_values(c) for c in t.columns]
    return [tuple(r) for r in zip(*cols, strict=True)] if cols else []


def _values(column: pa.ChunkedArray) -> list:
    """A column's Python values; dates and timestamps that have none (DuckDB's infinities, years
    past 9999) make the column's values its stored integers (both sides' types are equal)."""
    try:
        return column.to_pylist()
    except (OverflowError, ValueError):
        t = column.type
        if pa.types.is_date32(t):
            return column.cast(pa.int32()).to_pylist()
        if pa.types.is_date64(t) or pa.types.is_timestamp(t):
            return column.cast(pa.int64()).to_pylist()
        raise


def _close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) and math.isnan(b):
            return True
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _sortable(v: object, digits: int | None) -> object:
    # Floats may be rounded for sorting only, so rows whose floats differ in the last bits pair up;
    # NaN sorts after every number (as in DuckDB), not among them, so that it pairs with NaN;
    # nested values (structs, lists, maps) sort by their text.
    if isinstance(v, float):
        return (1, 0.0) if math.isnan(v) else (0, v if digits is None else round(v, digits))
    if isinstance(v, dict | list | tuple):
        return repr(v)
    return v


def _key(row: tuple, digits: int | None = None) -> tuple:
    return tuple((v is None, str(type(v)), _sortable(v, digits) if v is not None else 0) for v in row)


def _unpaired(got_rows: list[tuple], want_rows: list[tuple]) -> str | None:
    """None when the rows pair up as multisets (floats within tolerance), else the first that did
    not. Sorted exactly, then with floats rounded (last-bit differences reorder rows), then, for
    results small enough, each row matched with any equal one: rounding ties rows whose floats
    differ (0.1 as a DOUBLE and as a FLOAT) and may then pair them wrongly."""
    first = None
    for digits in (None, 6):
        by = functools.partial(_key, digits=digits)
        pairs = zip(sorted(got_rows, key=by), sorted(want_rows, key=by), strict=True)
        bad = next(((g, w) for g, w in pairs if not _same(g, w)), None)
        if bad is None:
            return None
        first = first or bad
    if len(got_rows) <= 2000:
        left = list(want_rows)
        for g in got_rows:
            i = next((i for i, w in enumerate(left) if _same(g, w)), None)
            if i is None:
                return f"row {g} has no match"
            del left[i]
        return None
    assert first is not None
    return f"row {first[0]} != {first[1]}"


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
    unpaired = _unpaired(got_rows, want_rows)
    if unpaired is not None:
        return unpaired
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
