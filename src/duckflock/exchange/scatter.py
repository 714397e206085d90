"""Per-target Arrow arrays from one scatter pass per column (the compiled loops in ``_scatter.c``).

A histogram of the targets gives each target's row count, and so the size of each of its buffers,
allocated once per target and column; one pass over the column writes every row to the next free
place of its target's buffer. Each target's array is made of its own buffers: nothing is copied
after the scatter, and the buffers go on the wire as they are. numpy and Arrow offer only gathers
(one ``take`` per target and column, after a sort or one comparison pass per target), which read
each column once per target.

Handled: flat columns (``arrays.flat``: fixed-width, boolean, NULL-typed, strings and binaries with
32- or 64-bit offsets), with or without NULLs, sliced or not. Other types (nested, dictionary,
views) keep the gather path of exchange/partition.py.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

import duckflock.exchange._scatter as _scatter
from duckflock.arrays import fixed_width, offset_width


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

    def _outputs(self, nbytes: np.ndarray) -> list[pa.Buffer | None]:
        """A buffer of its own for each target that gets rows: a target's rows are sent and freed
        on their own (its own rows, kept by the rank, do not hold the others' memory)."""
        return [
            pa.allocate_buffer(n) if c else None
            for n, c in zip(nbytes.tolist(), self.counts.tolist(), strict=True)
        ]

    def _fixed(self, chunks: list[pa.Array], width: int) -> list[pa.Buffer]:
        outs = self._outputs(self.counts * width)
        at = np.zeros(len(self.counts), dtype=np.int64)
        for c, targets in zip(chunks, self.chunks, strict=True):
            _scatter.scatter_fixed(c.buffers()[1], c.offset * width, width, targets, at, outs)
        self.nbytes += self.counts * width
        return [outs[k] for k in self.present]

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
        outs = self._outputs((self.counts + 7) // 8)
        at = np.zeros(len(self.counts), dtype=np.int64)
        ones = np.zeros(len(self.counts), dtype=np.int64)
        for (bitmap, offset), targets in zip(chunks, self.chunks, strict=True):
            _scatter.scatter_bits(bitmap, offset, targets, at, outs, ones)
        return outs, ones

    def _variable(self, chunks: list[pa.Array]) -> list[list[pa.Buffer]]:
        """Per target in ``present``: its offsets (from 0) and its data."""
        width = offset_width(chunks[0].type)
        assert width is not None
        counts = self.counts
        sizes = np.zeros(len(counts), dtype=np.int64)
        for c, targets in zip(chunks, self.chunks, strict=True):
            _scatter.var_sizes(c.buffers()[1], width, c.offset, targets, sizes)
        offsets = self._outputs((counts + 1) * width)
        data = self._outputs(sizes)
        offset_type = np.int32 if width == 4 else np.int64
        for out in offsets:
            if out is not None:
                np.frombuffer(out, dtype=offset_type, count=1)[0] = 0  # each output's first offset
        slots = np.where(counts > 0, width, 0)  # past each output's first offset
        positions = np.zeros(len(counts), dtype=np.int64)
        for c, targets in zip(chunks, self.chunks, strict=True):
            _, values_offsets, values = c.buffers()
            values = values if values is not None else pa.py_buffer(b"")
            _scatter.scatter_var(
                values_offsets, width, c.offset, values, targets, slots, positions, offsets, data
            )
        self.nbytes += np.where(counts > 0, (counts + 1) * width, 0) + sizes
        return [[offsets[k], data[k]] for k in self.present]
