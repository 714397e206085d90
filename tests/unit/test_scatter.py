"""The compiled scatter (exchange/scatter.py) against Arrow's own ``take`` of each target's rows."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duckflock.arrays import flat
from duckflock.exchange import _scatter
from duckflock.exchange.codec import frames_supported, from_frames, to_frames
from duckflock.exchange.partition import split_batches, split_by_target
from duckflock.exchange.scatter import Scatter


def _ints(rng, n, lo, hi):
    return rng.integers(lo, hi, n).tolist()


def _text(rng, n):
    return ["".join(chr(97 + c) for c in rng.integers(0, 26, int(k))) for k in rng.integers(0, 12, n)]


# type -> values for n rows, from a numpy Generator
VALUES = {
    pa.int8(): lambda r, n: _ints(r, n, -128, 128),
    pa.uint16(): lambda r, n: _ints(r, n, 0, 1 << 16),
    pa.int32(): lambda r, n: _ints(r, n, -(1 << 31), 1 << 31),
    pa.int64(): lambda r, n: _ints(r, n, -(1 << 62), 1 << 62),
    pa.uint64(): lambda r, n: _ints(r, n, 0, 1 << 62),
    pa.float32(): lambda r, n: r.random(n).astype(np.float32).tolist(),
    pa.float64(): lambda r, n: r.standard_normal(n).tolist(),
    pa.bool_(): lambda r, n: (r.random(n) < 0.5).tolist(),
    pa.decimal128(12, 2): lambda r, n: [Decimal(int(v)) / 100 for v in r.integers(-(10**11), 10**11, n)],
    pa.decimal256(40, 5): lambda r, n: [Decimal(int(v)).scaleb(-5) for v in r.integers(-(10**15), 10**15, n)],
    pa.date32(): lambda r, n: [
        dt.date(2000, 1, 1) + dt.timedelta(days=int(d)) for d in r.integers(0, 9000, n)
    ],
    pa.timestamp("us", "UTC"): lambda r, n: _ints(r, n, 0, 1 << 50),
    pa.time64("us"): lambda r, n: _ints(r, n, 0, 86_400_000_000),
    pa.duration("ms"): lambda r, n: _ints(r, n, -(1 << 40), 1 << 40),
    pa.month_day_nano_interval(): lambda r, n: [(int(a), 3, 7) for a in r.integers(0, 100, n)],
    pa.binary(3): lambda r, n: [bytes(r.integers(0, 256, 3).astype(np.uint8)) for _ in range(n)],
    pa.string(): _text,
    pa.large_string(): _text,
    pa.binary(): lambda r, n: [s.encode() for s in _text(r, n)],
    pa.large_binary(): lambda r, n: [s.encode() * 3 for s in _text(r, n)],
    pa.null(): lambda r, n: [None] * n,
    # not scattered: gathered by Arrow's take, in the same batch as the scattered columns
    pa.list_(pa.int64()): lambda r, n: [_ints(r, int(k), 0, 9) for k in r.integers(0, 4, n)],
    pa.dictionary(pa.int8(), pa.string()): lambda r, n: [
        ["a", "b", "c"][int(k)] for k in r.integers(0, 3, n)
    ],
}


def _column(rng, t, n, null_share):
    values = VALUES[t](rng, n)
    nulls = rng.random(n) < null_share
    return pa.array([None if z else v for v, z in zip(values, nulls, strict=True)], type=t)


def _targets(rng, n, size, mode):
    if mode == "one":
        return np.full(n, rng.integers(0, size), dtype=np.uint16)
    if mode == "skewed":
        return np.where(rng.random(n) < 0.9, 0, rng.integers(0, size, n)).astype(np.uint16)
    return rng.integers(0, size, n).astype(np.uint16)


@st.composite
def _one_batch(draw, types, size):
    """A batch of ``types`` whose last column is the target, its columns possibly a slice of larger
    ones."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.sampled_from([0, 1, 2, 7, 8, 9, 63, 64, 65, 300]))
    before, after = draw(st.integers(0, 20)), draw(st.integers(0, 5))
    null_share = draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))
    mode = draw(st.sampled_from(["random", "one", "skewed"]))
    total = before + n + after
    columns = [_column(rng, t, total, null_share) for t in types]
    columns.append(pa.array(_targets(rng, total, size, mode)))
    names = [f"c{i}" for i in range(len(types))] + ["__target"]
    return pa.RecordBatch.from_arrays(columns, names).slice(before, n)


@st.composite
def batches(draw, most=1):
    """(1 to ``most`` batches of one schema, size)."""
    size = draw(st.integers(1, 64))
    types = draw(st.lists(st.sampled_from(list(VALUES)), min_size=1, max_size=6))
    return draw(st.lists(_one_batch(types, size), min_size=1, max_size=most)), size


def _expected(batch: pa.RecordBatch, size: int) -> list[tuple[int, pa.RecordBatch]]:
    """Each target's rows in input order, by Arrow's take."""
    targets = np.asarray(batch.column(batch.num_columns - 1).to_pylist(), dtype=np.int64)
    data = batch.drop_columns(["__target"])
    out = []
    for t in range(size):
        rows = np.flatnonzero(targets == t)
        if len(rows):
            out.append((t, data.take(pa.array(rows))))
    return out


@settings(max_examples=300, deadline=None)
@given(batches())
def test_split_equals_arrow_take_of_each_targets_rows(case):
    [batch], size = case
    got = split_by_target(batch, size)
    want = _expected(batch, size)
    assert [t for t, _ in got] == [t for t, _ in want]
    for (_, g), (_, w) in zip(got, want, strict=True):
        assert g.schema.equals(w.schema)
        g.validate(full=True)
        assert g.equals(w)
        if len(want) > 1:  # pieces are compact, and cross the wire as frames unchanged
            assert all(c.offset == 0 for c in g.columns)
        if len(want) > 1 and frames_supported(g.schema):
            _, [back] = from_frames(to_frames(g.schema.serialize().to_pybytes(), [g]))
            assert back.equals(w)


@settings(max_examples=150, deadline=None)
@given(batches(most=4))
def test_several_batches_split_at_once_equal_their_concatenation_split(case):
    """One piece per target from several batches (some with NULLs, some without, some sliced)."""
    bs, size = case
    got = split_batches(bs, size)
    whole = pa.Table.from_batches(bs).combine_chunks().to_batches()
    want = _expected(whole[0], size) if whole else []
    if len(want) == 1:  # all rows to one target: the batches themselves, not copied
        assert [(t, b) for t, b, _ in got] == [
            (want[0][0], b.drop_columns(["__target"])) for b in bs if b.num_rows
        ]
        return
    assert [t for t, _, _ in got] == [t for t, _ in want]
    for (_, g, nbytes), (_, w) in zip(got, want, strict=True):
        g.validate(full=True)
        assert g.equals(w)
        # scattered columns: their own buffers; gathered ones: as Arrow counts them
        own = sum(
            sum(b.size for b in c.buffers() if b is not None) if flat(c.type) else c.nbytes for c in g.columns
        )
        assert nbytes == own


def test_pieces_go_on_the_wire_as_they_are():
    """Frames are the scattered buffers themselves: no copy before sending."""
    batch = pa.record_batch(
        {
            "s": pa.array(["a", None, "ccc", "dd"] * 50),
            "__target": pa.array([0, 1, 2] * 66 + [1, 2], pa.uint16()),
        }
    )
    for _, piece in split_by_target(batch, 3):
        frames = to_frames(piece.schema.serialize().to_pybytes(), [piece])
        column = piece.column(0)
        assert [f.address for f in frames[1:]] == [b.address for b in column.buffers() if b is not None]
        _, [back] = from_frames([memoryview(f).tobytes() for f in frames])
        assert back.equals(piece)


def test_every_flat_type_is_scattered_and_nested_ones_are_not():
    assert all(flat(t) for t in list(VALUES)[:-2])
    assert not flat(pa.list_(pa.int64()))
    assert not flat(pa.dictionary(pa.int8(), pa.string()))
    assert not flat(pa.string_view())


@pytest.mark.parametrize("size", [1, 2, 64])
def test_a_target_outside_the_ranks_is_an_error(size):
    with pytest.raises(ValueError, match="outside"):
        Scatter(np.array([0, size], dtype=np.uint16), size)


def test_outputs_that_do_not_fit_their_rows_are_refused_not_overrun():
    """The kernel checks every write against its target's output."""
    targets = np.array([0, 0, 1], dtype=np.uint16)
    values = np.arange(3, dtype=np.int64)

    def scatter(values, sizes, at=(0, 0)):
        outs = [bytearray(n) for n in sizes]
        _scatter.scatter_fixed(values, 0, 8, targets, np.array(at, dtype=np.int64), outs)

    with pytest.raises(ValueError, match="past its output"):  # target 0 gets 2 rows, room for 1
        scatter(values, [8, 16])
    with pytest.raises(ValueError, match="cursors outside"):
        scatter(values, [16, 8], at=[0, 16])
    with pytest.raises(ValueError, match="a list of 2"):
        scatter(values, [16, 8, 8])
    with pytest.raises(ValueError, match="values"):  # fewer values than targets
        scatter(values[:2], [16, 8])
