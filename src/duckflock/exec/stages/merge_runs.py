"""The driver's merge of sorted runs: each rank sorted its rows on the ORDER BY key and the driver
received them in rank order, so the result is a concatenation of sorted runs. numpy's stable sort
(timsort) finds those runs and merges them in O(n log runs), where sorting again in DuckDB on the
driver alone took as long as the ranks' whole join (issue: the seed report's join).

One key that is a column of a fixed-width type is merged here; anything else (several keys, text,
expressions) returns None and the driver sorts with DuckDB, which is always correct.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from duckflock.arrays import arrow_array, null_mask
from duckflock.exec.stages.range_sort import sort_keys

# Not intervals: they order by normalized months, days and micros, not by their words.
_TIME_TYPES = (pa.types.is_date, pa.types.is_timestamp, pa.types.is_time, pa.types.is_duration)
# Decimals of up to 18 digits are their unscaled int64, which orders exactly as they do.
_MAX_INT64_DIGITS = 18


def merge(table: pa.Table, keys: tuple[str, ...], columns: tuple[str, ...]) -> pa.Table | None:
    """``table``'s rows in the order of ``keys`` and only ``columns``, or None where the key is not
    one this module merges."""
    order = merge_order(table, keys)
    if order is None:
        return None
    # One gather per column from contiguous buffers: faster than taking across many chunks.
    return table.select(list(columns)).combine_chunks().take(arrow_array(order))


def merge_order(table: pa.Table, keys: tuple[str, ...]) -> np.ndarray | None:
    """The row positions of ``table`` in the order ``keys`` (one ORDER BY key, DuckDB's semantics:
    NaN above every number, NULLs last unless NULLS FIRST) gives them; ties in any order."""
    parsed = sort_keys(keys)
    if len(parsed) != 1:
        return None
    expr, desc, nulls_first = parsed[0]
    name = expr[1:-1] if expr.startswith('"') and expr.endswith('"') and expr.count('"') == 2 else None
    if name is None or name not in table.column_names:
        return None
    column = table.column(name).combine_chunks()
    values = _ascending_values(column, desc)
    if values is None:
        return None
    nulls = null_mask(column) if column.null_count else np.zeros(len(column), dtype=bool)
    nans = np.isnan(values) if values.dtype.kind == "f" else np.zeros(len(column), dtype=bool)
    if not nulls.any() and not nans.any():
        return np.argsort(values, kind="stable")
    plain = np.flatnonzero(~(nulls | nans))
    merged = plain[np.argsort(values[plain], kind="stable")]
    nan_rows = np.flatnonzero(nans & ~nulls)
    # DuckDB orders NaN above every number: last ascending, first descending.
    numbers = [nan_rows, merged] if desc else [merged, nan_rows]
    null_rows = np.flatnonzero(nulls)
    parts = [null_rows, *numbers] if nulls_first else [*numbers, null_rows]
    return np.concatenate(parts)


def _ascending_values(column: pa.Array, desc: bool) -> np.ndarray | None:
    """The key as numbers that ascend in the requested order (descending keys inverted), or None for
    a type that has no such view here. Null slots hold arbitrary values."""
    t = column.type
    if pa.types.is_decimal(t):
        if t.bit_width > 64 and t.precision > _MAX_INT64_DIGITS:
            return None
        # Unscaled little-endian integers; within 18 digits the low int64 word of a decimal128 is
        # the value.
        step = t.bit_width // 64 or 1
        words = np.frombuffer(column.buffers()[1], dtype=f"<i{min(t.bit_width, 64) // 8}")
        values = words[step * column.offset : step * (column.offset + len(column)) : step]
    elif pa.types.is_boolean(t):
        values = np.asarray(column.fill_null(False).to_numpy(zero_copy_only=False), dtype=np.uint8)
    elif pa.types.is_floating(t):
        values = column.fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        return -values if desc else values
    elif pa.types.is_integer(t):
        values = _numbers(column)
    elif any(is_type(t) for is_type in _TIME_TYPES):  # one integer word each, ordered as the times
        values = _numbers(column.view(pa.int32() if t.bit_width == 32 else pa.int64()))
    else:
        return None
    # ~x reverses the order of signed and unsigned integers alike, without overflow.
    return ~values if desc else values


def _numbers(column: pa.Array) -> np.ndarray:
    return column.fill_null(0).to_numpy() if column.null_count else column.to_numpy()
