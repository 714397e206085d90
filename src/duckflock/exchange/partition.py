"""Split a record batch into per-target batches by a target-rank column computed inside DuckDB.

numpy's stable argsort on small unsigned integers is a radix sort (O(n)); one ``take`` then lays the
rows out target by target, and each target's rows are a zero-copy slice of the result.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from duckflock.exchange.arrays import numpy_view


def split_by_target(batch: pa.RecordBatch, size: int) -> list[tuple[int, pa.RecordBatch]]:
    """(target, rows) for each target that gets rows. The last column holds the target rank."""
    dest = batch.column(batch.num_columns - 1)
    data = batch.drop_columns([batch.schema.names[-1]])
    if batch.num_rows == 0:
        return []
    targets = numpy_view(dest).astype(np.uint16, copy=False)
    counts = np.bincount(targets, minlength=size)
    nonzero = np.flatnonzero(counts)
    if len(nonzero) == 1:
        return [(int(nonzero[0]), data)]
    order = np.argsort(targets, kind="stable")
    laid_out = data.take(pa.array(order))
    out = []
    start = 0
    for t in range(size):
        n = int(counts[t])
        if n:
            out.append((t, laid_out.slice(start, n)))
            start += n
    return out
