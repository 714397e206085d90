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
    """The targets of the rows of one or more batches; ``column`` splits a column given as its
    chunks, one per batch, into one array per target."""

    def __init__(self, targets: list[np.ndarray], size: int) -> None:
        self.chunks = [np.ascontiguousarray(t, dtype=np.uint16) for t in targets]
        self.counts = np.zeros(size, dtype=np.int64)
        counts = np.empty(size, dtype=np.int64)
        for chunk in self.chunks:
            _scatter.histogram(chunk, size, counts)  # raises on a target outside 0..size-1
            self.counts += counts
        self.present: list[int] = np.flatnonzero(self.counts).tolist()
        self.nbytes = np.zeros(size, dtype=np.int64)  # per target: the bytes of its columns so far

    def column(self, chunks: list[pa.Array]) -> list[pa.Array]:
        """One array per target in ``present``, holding its rows in input order."""
        t = chunks[0].type
        counts = self.counts
        if pa.types.is_null(t):
            return [pa.nulls(counts[k], t) for k in self.present]
        validity, nulls = self._validity(chunks)
        if pa.types.is_boolean(t):
            values, _ = self._bits([(c.buffers()[1], c.offset) for c in chunks])
            self.nbytes += (counts + 7) // 8
            buffers = [[values[k]] for k in self.present]
        elif fixed_width(t):
            buffers = [[b] for b in self._fixed(chunks, t.bit_width // 8)]
        else:
            buffers = self._variable(chunks)
        return [
            pa.Array.from_buffers(t, counts[k], [validity[k], *b], null_count=nulls[k])
            for k, b in zip(self.present, buffers, strict=True)
        ]

    def _fixed(self, chunks: list[pa.Array], width: int) -> list[pa.Buffer]:
        starts = _regions(self.counts * width, math.lcm(_ALIGN, width))  # slots of whole values
        out = pa.allocate_buffer(int(starts[-1]))
        at = starts[:-1].copy()
        for c, targets in zip(chunks, self.chunks, strict=True):
            _scatter.scatter_fixed(c.buffers()[1], c.offset * width, width, targets, starts, at, out)
        self.nbytes += self.counts * width
        return [out.slice(starts[k], self.counts[k] * width) for k in self.present]

    def _validity(self, chunks: list[pa.Array]) -> tuple[list, np.ndarray]:
        """Per target: its validity bitmap (None where it has no NULLs) and its NULL count."""
        if not any(c.null_count for c in chunks):
            return [None] * len(self.counts), np.zeros(len(self.counts), dtype=np.int64)
        bitmaps, ones = self._bits([(c.buffers()[0] if c.null_count else None, c.offset) for c in chunks])
        nulls = self.counts - ones
        self.nbytes += np.where(nulls > 0, (self.counts + 7) // 8, 0)
        return [b if n else None for b, n in zip(bitmaps, nulls.tolist(), strict=True)], nulls

    def _bits(self, chunks: list[tuple[pa.Buffer | None, int]]) -> tuple[list, np.ndarray]:
        """Per target: a bitmap of its rows' bits (all set for a chunk without a bitmap), starting at
        bit 0; and how many bits are set."""
        nbytes = (self.counts + 7) // 8
        starts = _regions(nbytes)
        out = pa.allocate_buffer(int(starts[-1]))
        np.frombuffer(out, dtype=np.uint8)[:] = 0
        at = starts[:-1] * 8
        ones = np.zeros(len(self.counts), dtype=np.int64)
        for (bitmap, offset), targets in zip(chunks, self.chunks, strict=True):
            _scatter.scatter_bits(bitmap, offset, targets, starts, at, out, ones)
        return [out.slice(starts[k], nbytes[k]) for k in range(len(self.counts))], ones

    def _variable(self, chunks: list[pa.Array]) -> list[list[pa.Buffer]]:
        """Per target in ``present``: its offsets (from 0) and its data."""
        width = offset_width(chunks[0].type)
        assert width is not None
        sizes = np.zeros(len(self.counts), dtype=np.int64)
        for c, targets in zip(chunks, self.chunks, strict=True):
            _scatter.var_sizes(c.buffers()[1], width, c.offset, targets, sizes)
        counts = self.counts
        offset_starts = _regions(np.where(counts > 0, (counts + 1) * width, 0))
        data_starts = _regions(sizes)
        out_offsets = pa.allocate_buffer(int(offset_starts[-1]))
        out_data = pa.allocate_buffer(int(data_starts[-1]))
        firsts = offset_starts[:-1][counts > 0] // width  # each target's first offset: 0
        np.frombuffer(out_offsets, dtype=np.int32 if width == 4 else np.int64)[firsts] = 0
        slots = np.where(counts > 0, offset_starts[:-1] + width, offset_starts[:-1])
        positions = data_starts[:-1].copy()
        for c, targets in zip(chunks, self.chunks, strict=True):
            _, offsets, data = c.buffers()
            data = data if data is not None else pa.py_buffer(b"")
            _scatter.scatter_var(
                offsets, width, c.offset, data, targets, offset_starts, data_starts, slots, positions,
                out_offsets, out_data,
            )  # fmt: skip
        self.nbytes += np.where(counts > 0, (counts + 1) * width, 0) + sizes
        return [
            [
                out_offsets.slice(offset_starts[k], (counts[k] + 1) * width),
                out_data.slice(data_starts[k], sizes[k]),
            ]
            for k in self.present
        ]
