"""Split record batches into per-target batches by a target-rank column computed inside DuckDB.

Each target gets a compact batch of its own (offset 0, no slack) from one or several input batches,
so its buffers can go on the wire as they are. Flat columns are scattered in one pass each
(exchange/scatter.py). Other columns (nested, dictionary) are gathered: row indices per target come
from one comparison pass per target when there are few targets (cheaper than a sort), else from
numpy's stable argsort, a radix sort on small unsigned integers; Arrow's ``take`` then gathers each
target's rows.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from duckflock.arrays import arrow_array, flat, numpy_view
from duckflock.exchange.codec import no_columns
from duckflock.exchange.scatter import Scatter

# Up to this many targets, one ``targets == t`` pass per target beats an argsort.
_SCAN_TARGETS = 4


def split_by_target(batch: pa.RecordBatch, size: int) -> list[tuple[int, pa.RecordBatch]]:
    """(target, rows) for each target that gets rows, in target order, each row in input order.
    The last column holds the target rank."""
    return [(t, rows) for t, rows, _ in split_batches([batch], size)]


def split_batches(batches: list[pa.RecordBatch], size: int) -> list[tuple[int, pa.RecordBatch, int]]:
    """(target, rows, their bytes) for each target that gets rows of any of ``batches``, in target
    order, each row in input order: one batch per target, however many batches came in (fewer,
    larger pieces where there are many targets) — or the batches themselves, where all rows go to
    one target. The last column holds the target rank."""
    batches = [b for b in batches if b.num_rows]
    if not batches:
        return []
    targets = [numpy_view(b.column(b.num_columns - 1)).astype(np.uint16, copy=False) for b in batches]
    data = [b.drop_columns([b.schema.names[-1]]) for b in batches]
    scatter = Scatter(targets, size)
    present = scatter.present
    if len(present) == 1:  # all rows go to one target: nothing to copy
        return [(present[0], d, d.nbytes) for d in data]
    schema = data[0].schema
    if not schema.names:  # only a row count to keep
        return [(t, no_columns(int(scatter.counts[t]), schema), 0) for t in present]
    gathered = None
    columns = []  # per column, its array for each target in ``present``
    for i, field in enumerate(schema):
        chunks = [d.column(i) for d in data]
        if flat(field.type):
            columns.append(scatter.column(chunks))
            continue
        if gathered is None:
            gathered = [arrow_array(rows) for _, rows in rows_by_target(np.concatenate(targets), size)]
        whole = pa.chunked_array(chunks, type=field.type)
        pieces = [whole.take(rows).combine_chunks() for rows in gathered]
        scatter.nbytes[present] += [p.nbytes for p in pieces]
        columns.append(pieces)
    return [
        (t, pa.RecordBatch.from_arrays([c[k] for c in columns], schema=schema), int(scatter.nbytes[t]))
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
