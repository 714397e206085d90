"""Per-target Arrow arrays from one scatter pass per column (the compiled loops in ``_scatter.c``).

A histogram of the targets gives each target's row count; exclusive sums of the bytes each target
needs give the start of its region in one output allocation per buffer (64-byte aligned, as Arrow
allocates); one pass over the column writes every row to its target's region. Each target's array
is slices of those allocations: nothing is copied after the scatter, and the slices go on the wire
as they are. numpy and Arrow offer only gathers (one ``take`` per target and column, after a sort or
one comparison pass per target), which read each column once per target.

Handled: flat columns (``arrays.flat``: fixed-width, boolean, NULL-typed, strings and binaries with
32- or 64-bit offsets), with or without NULLs, sliced or not. Other types (nested, dictionary,
views) keep the gather path of exchange/partition.py.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

import duckflock.exchange._scatter as _scatter
from duckflock.arrays import fixed_width, offset_width

_ALIGN = 64


def _regions(nbytes: np.ndarray, align: int = _ALIGN) -> np.ndarray:
    """size + 1 exclusive offsets: region t is [starts[t], starts[t + 1]), each start a multiple
    of ``align``."""
    starts = np.zeros(len(nbytes) + 1, dtype=np.int64)
    np.cumsum((nbytes + (align - 1)) // align * align, out=starts[1:])
    return starts


class Scatter:
    """The targets of one batch's rows; ``column`` splits each of its columns."""

    def __init__(self, targets: np.ndarray, size: int) -> None:
        self.targets = np.ascontiguousarray(targets, dtype=np.uint16)
        self.counts = np.empty(size, dtype=np.int64)
        _scatter.histogram(self.targets, size, self.counts)  # raises on a target outside 0..size-1
        self.present: list[int] = np.flatnonzero(self.counts).tolist()

    def column(self, column: pa.Array) -> list[pa.Array]:
        """One array per target in ``present``, holding its rows in input order."""
        t = column.type
        counts = self.counts
        if pa.types.is_null(t):
            return [pa.nulls(counts[k], t) for k in self.present]
        validity, nulls = self._validity(column)
        if pa.types.is_boolean(t):
            values, _ = self._bits(column.buffers()[1], column.offset)
            buffers = [[values[k]] for k in self.present]
        elif fixed_width(t):
            width = t.bit_width // 8
            starts = _regions(counts * width, math.lcm(_ALIGN, width))  # slots of whole values
            out = pa.allocate_buffer(int(starts[-1]))
            _scatter.scatter_fixed(
                column.buffers()[1], column.offset * width, width, self.targets, starts, out
            )
            buffers = [[out.slice(starts[k], counts[k] * width)] for k in self.present]
        else:
            buffers = self._variable(column)
        return [
            pa.Array.from_buffers(t, counts[k], [validity[k], *b], null_count=nulls[k])
            for k, b in zip(self.present, buffers, strict=True)
        ]

    def _validity(self, column: pa.Array) -> tuple[list, np.ndarray]:
        """Per target: its validity bitmap (None without NULLs) and its NULL count."""
        if not column.null_count:
            return [None] * len(self.counts), np.zeros(len(self.counts), dtype=np.int64)
        bitmaps, ones = self._bits(column.buffers()[0], column.offset)
        return bitmaps, self.counts - ones

    def _bits(self, bitmap: pa.Buffer, offset: int) -> tuple[list, np.ndarray]:
        """Per target: a bitmap of its rows' bits, starting at bit 0; and how many bits are set."""
        nbytes = (self.counts + 7) // 8
        starts = _regions(nbytes)
        out = pa.allocate_buffer(int(starts[-1]))
        ones = np.empty(len(self.counts), dtype=np.int64)
        _scatter.scatter_bits(bitmap, offset, self.targets, starts, out, ones)
        return [out.slice(starts[k], nbytes[k]) for k in range(len(self.counts))], ones

    def _variable(self, column: pa.Array) -> list[list[pa.Buffer]]:
        """Per target in ``present``: its offsets (from 0) and its data."""
        width = offset_width(column.type)
        assert width is not None
        _, offsets, data = column.buffers()
        data = data if data is not None else pa.py_buffer(b"")
        sizes = np.empty(len(self.counts), dtype=np.int64)
        _scatter.var_sizes(offsets, width, column.offset, self.targets, sizes)
        counts = self.counts
        offset_starts = _regions(np.where(counts > 0, (counts + 1) * width, 0))
        data_starts = _regions(sizes)
        out_offsets = pa.allocate_buffer(int(offset_starts[-1]))
        out_data = pa.allocate_buffer(int(data_starts[-1]))
        _scatter.scatter_var(
            offsets,
            width,
            column.offset,
            data,
            self.targets,
            offset_starts,
            data_starts,
            out_offsets,
            out_data,
        )
        return [
            [
                out_offsets.slice(offset_starts[k], (counts[k] + 1) * width),
                out_data.slice(data_starts[k], sizes[k]),
            ]
            for k in self.present
        ]
