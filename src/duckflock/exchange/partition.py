"""Split a record batch into per-target batches by a target-rank column computed inside DuckDB.

Each target gets a compact batch of its own (offset 0, no slack), so its buffers can go on the wire
as they are. Row indices per target come from one comparison pass per target when there are few
targets (cheaper than a sort), else from numpy's stable argsort, a radix sort on small unsigned
integers. Null-free fixed-width columns are gathered with numpy's ``take``, faster than Arrow's on
this kind of data; everything else uses Arrow's ``take``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from duckflock.arrays import arrow_array, fixed_width_view, numpy_view

# Up to this many targets, one ``targets == t`` pass per target beats an argsort.
_SCAN_TARGETS = 4


def split_by_target(batch: pa.RecordBatch, size: int) -> list[tuple[int, pa.RecordBatch]]:
    """(target, rows) for each target that gets rows, in target order, each row in input order.
    The last column holds the target rank."""
    if batch.num_rows == 0:
        return []
    targets = numpy_view(batch.column(batch.num_columns - 1)).astype(np.uint16, copy=False)
    data = batch.drop_columns([batch.schema.names[-1]])
    groups = rows_by_target(targets, size)
    if len(groups) == 1:
        return [(groups[0][0], data)]  # all rows go to one target: nothing to copy
    return [(t, take(data, rows)) for t, rows in groups]


def rows_by_target(targets: np.ndarray, size: int) -> list[tuple[int, np.ndarray]]:
    """(target, ascending row indices) for every target that gets rows."""
    if size <= _SCAN_TARGETS:
        groups = []
        placed = 0
        for t in range(size):
            rows = np.flatnonzero(targets == t)
            if len(rows) == len(targets):
                return [(t, rows)]
            if len(rows):
                groups.append((t, rows))
                placed += len(rows)
        if placed != len(targets):
            raise ValueError(f"a target rank outside 0..{size - 1}")
        return groups
    counts = np.bincount(targets, minlength=size)
    if len(counts) > size:
        raise ValueError(f"a target rank outside 0..{size - 1}")
    order = np.argsort(targets, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(counts)))
    return [(t, order[bounds[t] : bounds[t + 1]]) for t in np.flatnonzero(counts).tolist()]


def take(batch: pa.RecordBatch, rows: np.ndarray) -> pa.RecordBatch:
    """The given rows of ``batch`` as a new compact batch."""
    if batch.num_columns == 0:
        return batch.slice(0, len(rows))  # only a row count to keep
    arrow_rows = None
    columns = []
    for column in batch.columns:
        values = fixed_width_view(column)
        if values is not None:
            gathered = pa.py_buffer(np.take(values, rows))
            columns.append(pa.Array.from_buffers(column.type, len(rows), [None, gathered], null_count=0))
            continue
        if arrow_rows is None:
            arrow_rows = arrow_array(rows)
        columns.append(column.take(arrow_rows))
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)
