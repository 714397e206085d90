"""Split a record batch into per-target batches by a target-rank column computed inside DuckDB.

Each target gets a compact batch of its own (offset 0, no slack), so its buffers can go on the wire
as they are. Flat columns are scattered in one pass each (exchange/scatter.py). Other columns
(nested, dictionary) are gathered: row indices per target come from one comparison pass per target
when there are few targets (cheaper than a sort), else from numpy's stable argsort, a radix sort on
small unsigned integers; Arrow's ``take`` then gathers each target's rows.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from duckflock.arrays import arrow_array, flat, numpy_view
from duckflock.exchange.scatter import Scatter

# Up to this many targets, one ``targets == t`` pass per target beats an argsort.
_SCAN_TARGETS = 4


def split_by_target(batch: pa.RecordBatch, size: int) -> list[tuple[int, pa.RecordBatch]]:
    """(target, rows) for each target that gets rows, in target order, each row in input order.
    The last column holds the target rank."""
    if batch.num_rows == 0:
        return []
    targets = numpy_view(batch.column(batch.num_columns - 1)).astype(np.uint16, copy=False)
    data = batch.drop_columns([batch.schema.names[-1]])
    scatter = Scatter(targets, size)
    present = scatter.present
    if len(present) == 1:
        return [(present[0], data)]  # all rows go to one target: nothing to copy
    if data.num_columns == 0:  # only a row count to keep
        return [(t, data.slice(0, scatter.counts[t])) for t in present]
    gathered = None
    columns = []  # per column, its array for each target in ``present``
    for column in data.columns:
        if flat(column.type):
            columns.append(scatter.column(column))
            continue
        if gathered is None:
            gathered = [arrow_array(rows) for _, rows in rows_by_target(targets, size)]
        columns.append([column.take(rows) for rows in gathered])
    return [
        (t, pa.RecordBatch.from_arrays([c[k] for c in columns], schema=data.schema))
        for k, t in enumerate(present)
    ]


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
