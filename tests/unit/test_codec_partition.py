"""Wire encoding of record batches and splitting batches by target rank (property-based)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from decimal import Decimal

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duckflock.arrays import arrow_array
from duckflock.exchange.codec import decode, encode, frames_supported, from_frames, to_frames, write_options
from duckflock.exchange.partition import split_by_target

COMPRESSIONS = ["none", "lz4", "zstd"]
FAST = settings(max_examples=35)

SCHEMA = pa.schema(
    [
        ("i", pa.int64()),
        ("s", pa.string()),
        ("d", pa.decimal128(12, 2)),
        ("day", pa.date32()),
        ("f", pa.float64()),
        ("b", pa.bool_()),
        ("l", pa.list_(pa.int32())),
    ]
)

_row = st.fixed_dictionaries(
    {
        "i": st.none() | st.integers(-(2**63), 2**63 - 1),
        "s": st.none() | st.text(max_size=12),
        "d": st.none() | st.integers(-(10**11), 10**11).map(lambda c: Decimal(c).scaleb(-2)),
        "day": st.none() | st.dates(dt.date(1900, 1, 1), dt.date(2200, 1, 1)),
        "f": st.none() | st.floats(allow_nan=False),
        "b": st.none() | st.booleans(),
        "l": st.none() | st.lists(st.none() | st.integers(-(2**31), 2**31 - 1), max_size=3),
    }
)


@st.composite
def batches(draw, max_rows: int = 25) -> list[pa.RecordBatch]:
    """A list of batches of one schema: some empty, some sliced (non-zero offsets), some not."""
    rows = draw(st.lists(_row, max_size=max_rows))
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    cuts = sorted(draw(st.lists(st.integers(0, len(rows)), max_size=4)))
    out = []
    start = 0
    for c in [*cuts, len(rows)]:
        piece = table.slice(start, c - start).combine_chunks()
        out.extend(piece.to_batches() or [pa.RecordBatch.from_pylist([], schema=SCHEMA)])
        start = c
    if draw(st.booleans()) and table.num_rows > 2:  # a batch that is a slice of a larger one
        whole = table.combine_chunks().to_batches()[0]
        out.append(whole.slice(1, table.num_rows - 2))
    return out


def _roundtrip(schema: pa.Schema, bs: list[pa.RecordBatch], compression: str) -> pa.Table:
    """Through the IPC encoding ("none", "lz4", "zstd") or as frames ("frames")."""
    if compression == "frames":
        assert frames_supported(schema)
        wire = [bytes(memoryview(f).cast("B")) for f in to_frames(schema.serialize().to_pybytes(), bs)]
        got_schema, got = from_frames(wire)
    else:
        got_schema, got = decode(encode(schema, bs, write_options(compression)))
    assert got_schema.equals(schema)
    assert len(got) == len(bs)
    return pa.Table.from_batches(got, schema=got_schema)


@FAST
@given(batches(), st.sampled_from(COMPRESSIONS))
def test_encode_decode_round_trip(bs, compression):
    got = _roundtrip(SCHEMA, bs, compression)
    assert got.equals(pa.Table.from_batches(bs, schema=SCHEMA))


FLAT = SCHEMA.remove(SCHEMA.get_field_index("l"))


@FAST
@given(batches())
def test_frames_round_trip(bs):
    """Frames carry each buffer as it is, with the array offsets of sliced batches."""
    flat = [b.drop_columns(["l"]) for b in bs]
    got = _roundtrip(FLAT, flat, "frames")
    assert got.equals(pa.Table.from_batches(flat, schema=FLAT))


def test_frames_of_a_small_slice_do_not_carry_its_parent_buffers():
    big = pa.record_batch({"a": np.arange(200_000), "s": [str(i) for i in range(200_000)]})
    piece = big.slice(150_000, 1000)
    frames = to_frames(big.schema.serialize().to_pybytes(), [piece])
    assert sum(memoryview(f).nbytes for f in frames) < 4 * piece.nbytes + 16_384
    _, [got] = from_frames([bytes(memoryview(f).cast("B")) for f in frames])
    assert got.equals(piece)


def test_batches_without_columns_keep_their_row_count():
    """count(*) over an exchange needs only how many rows there are."""
    empty_schema = pa.schema([])
    batch = pa.record_batch({"x": [1, 2, 3]}).drop_columns(["x"])
    _, [got] = from_frames(to_frames(empty_schema.serialize().to_pybytes(), [batch]))
    assert got.num_rows == 3
    targeted = pa.record_batch({"__target": pa.array([0, 1, 1, 0, 1], pa.uint16())})
    assert [(t, b.num_rows) for t, b in split_by_target(targeted, 2)] == [(0, 2), (1, 3)]


@pytest.mark.parametrize("size", [2, 6])
def test_a_target_outside_the_ranks_is_an_error_not_a_lost_row(size):
    batch = pa.record_batch({"x": [1, 2, 3, 4], "__target": pa.array([0, 1, size + 3, 1], pa.uint16())})
    with pytest.raises(ValueError, match="outside"):
        split_by_target(batch, size)


def test_frames_are_not_used_for_nested_or_dictionary_columns():
    assert frames_supported(FLAT)
    assert not frames_supported(SCHEMA)  # a list column
    assert not frames_supported(pa.schema([("e", pa.dictionary(pa.int8(), pa.string()))]))
    assert not frames_supported(pa.schema([("v", pa.string_view())]))


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_empty_batch_list_keeps_the_schema(compression):
    got = _roundtrip(SCHEMA, [], compression)
    assert got.num_rows == 0
    assert got.schema.equals(SCHEMA)


@pytest.mark.parametrize("compression", [*COMPRESSIONS, "frames"])
def test_round_trip_of_duckdb_output(compression):
    """Batches exactly as DuckDB produces them: strings, decimals, dates, timestamps and NULLs."""
    table = duckdb.sql(
        "SELECT i::INTEGER AS i, CASE WHEN i % 5 = 0 THEN NULL ELSE 'str-' || i END AS s, "
        "(i * 1.25)::DECIMAL(12,2) AS d, (i / 3)::DECIMAL(38,10) AS wide, "
        "DATE '2000-01-01' + i::INTEGER AS day, "
        "TIMESTAMP '2000-01-01' + to_seconds(i) AS ts, i::HUGEINT * 1000000000000 AS h, "
        "CASE WHEN i % 7 = 0 THEN NULL ELSE i / 7 END AS f FROM range(5000) t(i)"
    ).to_arrow_table()
    bs = table.to_batches(max_chunksize=999)
    got = _roundtrip(table.schema, bs, compression)
    assert got.equals(table)


@pytest.mark.parametrize("compression", [*COMPRESSIONS, "frames"])
def test_round_trip_of_many_long_strings(compression):
    rng = np.random.default_rng(3)
    words = ["x" * int(n) for n in rng.integers(0, 2000, size=300)]
    b = pa.record_batch({"w": pa.array(words)})
    bs = [b.slice(k, 37) for k in range(0, 300, 37)]
    got = _roundtrip(b.schema, bs, compression)
    assert got.column("w").to_pylist() == words


@pytest.mark.parametrize(
    "compression",
    [
        "none",
        "lz4",
        "zstd",
    ],
)
def test_round_trip_of_dictionary_encoded_enum_column(compression):
    table = duckdb.sql(
        "SELECT CAST(CASE WHEN i % 3 = 0 THEN 'a' WHEN i % 3 = 1 THEN 'b' END AS ENUM('a', 'b')) AS e, i "
        "FROM range(10) t(i)"
    ).to_arrow_table()
    assert pa.types.is_dictionary(table.schema.field("e").type)
    got = _roundtrip(table.schema, table.to_batches(), compression)
    assert got.column("e").to_pylist() == table.column("e").to_pylist()


# ---- split_by_target ----------------------------------------------------------------------------


def _with_target(rows: list[dict], targets: list[int]) -> pa.RecordBatch:
    t = pa.Table.from_pylist(rows, schema=SCHEMA)
    t = t.append_column("__target", pa.array(targets, pa.uint16()))
    return (
        t.combine_chunks().to_batches()[0] if t.num_rows else pa.RecordBatch.from_pylist([], schema=t.schema)
    )


@st.composite
def targeted(draw):
    size = draw(st.integers(1, 8))
    rows = draw(st.lists(_row, max_size=40))
    mode = draw(st.sampled_from(["random", "one", "skewed"]))
    if mode == "one":
        t = draw(st.integers(0, size - 1))
        targets = [t] * len(rows)
    elif mode == "skewed":
        targets = [draw(st.sampled_from([0, size - 1])) for _ in rows]
    else:
        targets = [draw(st.integers(0, size - 1)) for _ in rows]
    return size, rows, targets


@FAST
@given(targeted())
def test_split_by_target_places_every_row_once_in_order(case):
    size, rows, targets = case
    batch = _with_target(rows, targets)
    pieces = split_by_target(batch, size)
    expected_data = pa.Table.from_pylist(rows, schema=SCHEMA)
    # Targets appear once each, ascending, only when they get rows.
    got_targets = [t for t, _ in pieces]
    assert got_targets == sorted(set(targets))
    for t, piece in pieces:
        assert piece.schema.equals(SCHEMA)  # the target column is dropped
        want = [i for i, x in enumerate(targets) if x == t]
        # The rows of target t, in their original order (a stable split).
        assert piece.to_pylist() == expected_data.take(want).to_pylist()
    assert sum(p.num_rows for _, p in pieces) == len(rows)


@pytest.mark.parametrize("size", [2, 3, 4, 5, 9])
def test_split_of_a_sliced_batch_gathers_from_its_offset(size):
    """A batch that is a slice of a larger one: null-free fixed-width columns take the numpy path,
    which must honour the slice offset."""
    t = duckdb.sql(
        "SELECT i AS id, i::DOUBLE / 2 AS f, (i * 1.5)::DECIMAL(20,2) AS d, DATE '2000-01-01' + i::INTEGER AS day, "
        f"'s' || i AS s, CAST(i % {size} AS USMALLINT) AS __target FROM range(1000) t(i)"
    ).to_arrow_table()
    batch = t.combine_chunks().to_batches()[0].slice(101, 700)
    expected = t.slice(101, 700).drop_columns(["__target"]).to_pylist()
    got = {r["id"]: (target, r) for target, piece in split_by_target(batch, size) for r in piece.to_pylist()}
    assert len(got) == 700
    for r in expected:
        target, row = got[r["id"]]
        assert row == r
        assert target == r["id"] % size


@pytest.mark.parametrize("size", [1, 2, 5])
def test_split_empty_batch_gives_nothing(size):
    batch = _with_target([], [])
    assert batch.num_rows == 0
    assert split_by_target(batch, size) == []


@pytest.mark.parametrize(("size", "target"), [(1, 0), (4, 0), (4, 3), (7, 5)])
def test_split_all_rows_to_one_target_returns_the_batch_whole(size, target):
    rows = [{"i": k, "s": str(k)} for k in range(100)]
    pieces = split_by_target(_with_target(rows, [target] * 100), size)
    assert len(pieces) == 1
    t, piece = pieces[0]
    assert t == target
    assert piece.to_pylist() == pa.Table.from_pylist(rows, schema=SCHEMA).to_pylist()


def test_split_by_duckdb_computed_targets():
    """Targets computed by DuckDB (USMALLINT, as the stage's __target column) over 3 ranks."""
    t = duckdb.sql(
        "SELECT i AS id, 'v' || (i % 11) AS s, CAST(hash(i % 13) % 3 AS USMALLINT) AS __target "
        "FROM range(3000) t(i)"
    ).to_arrow_table()
    assert t.schema.field("__target").type == pa.uint16()
    all_rows: Counter = Counter()
    for batch in t.to_batches(max_chunksize=700):
        for target, piece in split_by_target(batch, 3):
            assert piece.column_names == ["id", "s"]
            ids = piece.column("id").to_pylist()
            # Recompute each row's target independently from its id.
            check = duckdb.sql(
                f"SELECT count(*) FROM (SELECT unnest({ids}::BIGINT[]) AS id) "
                f"WHERE hash(id % 13) % 3 <> {target}"
            ).fetchall()
            assert check == [(0,)]
            all_rows.update(zip(ids, piece.column("s").to_pylist(), strict=True))
    assert all_rows == Counter(zip(t.column("id").to_pylist(), t.column("s").to_pylist(), strict=True))


@pytest.mark.parametrize(
    "values",
    [
        np.arange(10, dtype=np.int64)[::3],  # strided
        np.array([3, 1, 2], dtype=np.uint16),
        np.array([True, False, True] * 5),  # packed into Arrow's bit order
        np.zeros(0, dtype=np.int32),
        np.zeros(0, dtype=bool),
    ],
)
def test_arrow_array_equals_pyarrows_conversion(values):
    got = arrow_array(values)
    assert got.equals(pa.array(values)) and got.null_count == 0
