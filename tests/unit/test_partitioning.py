"""Partitioning functions: hash types, co-location of hash and range partitionings.

The expected answers come from DuckDB (which values its joins consider equal, what its hash gives) or
from brute force over a small universe of keys, never from re-stating the implementation.
"""

from __future__ import annotations

import functools
from collections import Counter

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duckflock.catalog import PartitionInfo, TableInfo
from duckflock.catalog.partitioning import (
    Arbitrary,
    Hashed,
    Ranged,
    Replicated,
    Single,
    canonical_hash_type,
    co_located,
    common_hash_type,
    ranges_aligned,
)
from duckflock.catalog.placement import hash_sql, partition_sql, range_partition_sql, range_splitters

FAST = settings(max_examples=40)


@functools.cache
def _con() -> duckdb.DuckDBPyConnection:
    return duckdb.connect(config={"threads": 1})


def _column(values: list[object], duckdb_type: str, name: str = "x") -> str:
    """A DuckDB relation (SQL) with one column ``name`` of ``duckdb_type`` and a row id ``i``."""
    con = _con()
    table = f"src_{name}"
    con.register(table, pa.table({"v": pa.array(values, pa.int64()), "i": pa.array(range(len(values)))}))
    return f"(SELECT CAST(v AS {duckdb_type}) AS {name}, i FROM {table})"


def _partitions(values: list[object], duckdb_type: str, hash_type: str, n: int) -> list[int]:
    rel = _column(values, duckdb_type)
    sql = f"SELECT {hash_sql(['x'], (hash_type,), n)} FROM {rel} ORDER BY i"
    return [r[0] for r in _con().execute(sql).fetchall()]


# ---- canonical_hash_type / common_hash_type -------------------------------------------------------

SMALL_INTS = ["TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER"]
ALL_TYPES = [
    *SMALL_INTS,
    "UBIGINT",
    "HUGEINT",
    "UHUGEINT",
    "DECIMAL(12,2)",
    "DECIMAL(18,4)",
    "FLOAT",
    "DOUBLE",
    "REAL",
    "DATE",
    "TIMESTAMP",
    "TIMESTAMP WITH TIME ZONE",
    "VARCHAR",
    "BOOLEAN",
    "UUID",
    "BLOB",
    "TIME",
    "INTERVAL",
    "INTEGER[]",
    "DOUBLE[]",
    "STRUCT(x DOUBLE)",
]


_INT_BITS = {"TINYINT": 8, "SMALLINT": 16, "INTEGER": 32, "BIGINT": 64}


@pytest.mark.parametrize("t", SMALL_INTS)
def test_small_integer_types_hash_as_bigint_without_loss(t):
    """Every value of a small integer type survives the cast to its hash type (no overflow, no loss)."""
    h = canonical_hash_type(t)
    assert h == "BIGINT"
    if t.startswith("U"):
        lo, hi = 0, 2 ** _INT_BITS[t[1:]] - 1
    else:
        lo, hi = -(2 ** (_INT_BITS[t] - 1)), 2 ** (_INT_BITS[t] - 1) - 1
    sql = (
        f"SELECT CAST(CAST(CAST(?::HUGEINT AS {t}) AS {h}) AS HUGEINT), "
        f"CAST(CAST(CAST(?::HUGEINT AS {t}) AS {h}) AS HUGEINT)"
    )
    assert _con().execute(sql, [lo, hi]).fetchall() == [(lo, hi)]


@pytest.mark.parametrize("t", ["UBIGINT", "HUGEINT"])
def test_wide_integers_hash_as_hugeint(t):
    assert canonical_hash_type(t) == "HUGEINT"


def test_uhugeint_hashes_as_itself():
    """Its values beyond HUGEINT's range would not cast to it."""
    assert canonical_hash_type("UHUGEINT") == "UHUGEINT"


@pytest.mark.parametrize("t", ["DECIMAL(12,2)", "decimal(38,10)", "NUMERIC(5,1)", "FLOAT", "REAL", "DOUBLE"])
def test_non_integer_numbers_hash_as_double(t):
    assert canonical_hash_type(t) == "DOUBLE"


@pytest.mark.parametrize("t", ALL_TYPES)
def test_canonical_type_is_a_fixed_point_and_case_insensitive(t):
    h = canonical_hash_type(t)
    assert canonical_hash_type(h) == h
    if not t.endswith("]") and not t.startswith("STRUCT"):  # nested: kept as written (field names)
        assert canonical_hash_type(t.lower()) == h
    assert common_hash_type(t, t) == h


@given(st.sampled_from(ALL_TYPES), st.sampled_from(ALL_TYPES))
def test_common_hash_type_is_symmetric(a, b):
    assert common_hash_type(a, b) == common_hash_type(b, a)


def test_integer_types_of_different_width_share_a_hash_type():
    for a in SMALL_INTS:
        for b in SMALL_INTS:
            assert common_hash_type(a, b) == "BIGINT"
    assert common_hash_type("BIGINT", "UBIGINT") == "HUGEINT"
    assert common_hash_type("INTEGER", "DECIMAL(12,2)") == "DECIMAL(38,2)"
    assert common_hash_type("DECIMAL(38,0)", "DECIMAL(38,2)") == "DECIMAL(38,2)"
    assert common_hash_type("DECIMAL(12,2)", "DECIMAL(12,2)") == "DOUBLE"  # one type: one conversion
    assert common_hash_type("DATE", "TIMESTAMP") == "TIMESTAMP"


# Pairs of column types DuckDB will join on, with values of which some compare equal under DuckDB's
# own join. Every pair DuckDB matches must hash to the same partition under common_hash_type.
_MATCHING = [
    ("INTEGER", "BIGINT", ["-5", "0", "7", "2147483647", "NULL"], ["-5", "7", "2147483647", "9", "NULL"]),
    ("SMALLINT", "UINTEGER", ["0", "1", "32767"], ["0", "32767", "4294967295"]),
    ("TINYINT", "UTINYINT", ["0", "1", "127"], ["0", "127", "255"]),
    ("BIGINT", "UBIGINT", ["0", "9223372036854775807"], ["0", "9223372036854775807", "18446744073709551615"]),
    ("BIGINT", "HUGEINT", ["-1", "42"], ["-1", "42", "170141183460469231731687303715884105727"]),
    ("INTEGER", "DECIMAL(12,2)", ["0", "1", "-3", "100"], ["0.00", "1.00", "-3.00", "1.50", "100.00"]),
    ("DECIMAL(12,2)", "DECIMAL(18,4)", ["1.10", "2.25", "-0.01"], ["1.1000", "2.2500", "-0.0100", "3.1416"]),
    # Wide DECIMALs and HUGEINTs convert to DOUBLE otherwise than narrower or scaled ones: equal
    # values had unequal DOUBLEs. DuckDB compares them exactly.
    (
        "DECIMAL(38,0)",
        "DECIMAL(38,2)",
        ["26233561623403448431", "7"],
        ["26233561623403448431.00", "7.00", "7.5"],
    ),
    ("HUGEINT", "DECIMAL(38,2)", ["26233561623403448431", "-1"], ["26233561623403448431.00", "-1.00"]),
    ("BIGINT", "DECIMAL(38,0)", ["-26608296670972011", "5"], ["-26608296670972011", "5"]),
    ("INTEGER", "DOUBLE", ["0", "1", "-7"], ["0.0", "-0.0", "1.0", "-7.0", "0.5"]),
    ("FLOAT", "DOUBLE", ["0.5", "1.25", "0.1"], ["0.5", "1.25", "0.1"]),
    ("DATE", "TIMESTAMP", ["'2020-01-05'", "'1999-12-31'"], ["'2020-01-05 00:00:00'", "'2020-01-05 12:00'"]),
    ("VARCHAR", "INTEGER", ["'7'", "' 1'", "'007'"], ["7", "1", "8"]),
    ("VARCHAR", "VARCHAR", ["'a'", "'b'", "''"], ["'a'", "''", "'c'"]),
    # A string compares in the other side's type, rounded to it: not as a DOUBLE.
    ("INTEGER", "VARCHAR", ["8", "11", "3"], ["'7.5'", "'11.49'", "'3'"]),
    ("DECIMAL(12,3)", "VARCHAR", ["1.000", "2.250", "0.500"], ["'1.00049'", "'2.2504'", "'0.5'"]),
    ("FLOAT", "VARCHAR", ["0.1", "2.5"], ["'0.1'", "'2.5'"]),
    # Nested keys: -0.0 equals 0.0 inside them too, and an INTEGER list equals a DOUBLE one.
    ("DOUBLE[]", "DOUBLE[]", ["[-0.0]", "[1.5, NULL]"], ["[0.0]", "[1.5, NULL]"]),
    (
        "STRUCT(x DOUBLE, s VARCHAR)",
        "STRUCT(x DOUBLE, s VARCHAR)",
        ["{'x': -0.0, 's': 'a'}"],
        ["{'x': 0.0, 's': 'a'}"],
    ),
    ("INTEGER[]", "DOUBLE[]", ["[1]", "[2, 3]"], ["[1.0]", "[2.0, 3.0]", "[2.5]"]),
    ("TIMESTAMP[]", "DATE[]", ["['2020-01-05 00:00:00'::TIMESTAMP]"], ["['2020-01-05'::DATE]"]),
    # A FLOAT compares with an integer or DECIMAL as FLOAT: the other side rounds to it.
    ("FLOAT", "DECIMAL(6,1)", ["0.1", "0.2", "1.5"], ["0.1", "0.3", "1.5"]),
    ("FLOAT", "BIGINT", ["16777216", "3"], ["16777217", "16777216", "3"]),
    ("REAL", "INTEGER", ["16777216"], ["16777217"]),
    (
        "UHUGEINT",
        "UHUGEINT",
        ["340282366920938463463374607431768211455", "7"],
        ["340282366920938463463374607431768211455"],
    ),
    ("UHUGEINT", "BIGINT", ["7", "0"], ["7", "0", "-1"]),
    ("UHUGEINT", "FLOAT", ["16777219", "3"], ["16777220", "3"]),
    # JSON compares like a string: in the other side's type.
    ("JSON", "DOUBLE", ["'1'", "'2.5'"], ["1.0", "2.5"]),
    ("JSON", "INTEGER", ["'7.5'", "'3'"], ["8", "3"]),
    ("TIME WITH TIME ZONE", "TIME", ["'12:00:00+00'", "'13:30:00+00'"], ["'12:00:00'", "'13:30:00'"]),
    # An instant, whatever the zone: DATE and TIMESTAMP are cast to it in the session's zone.
    (
        "TIMESTAMP",
        "TIMESTAMP WITH TIME ZONE",
        ["'2021-03-14 02:30:00'", "'2020-01-05'"],
        ["'2021-03-14 02:30:00+00'", "'2020-01-05 00:00:00+00'"],
    ),
    ("DATE", "TIMESTAMP WITH TIME ZONE", ["'2020-01-05'"], ["'2020-01-05 00:00:00+00'"]),
]
_MIXED = [
    # common_hash_type falls back to VARCHAR, but DuckDB compares these by casting the string (or the
    # boolean) to the other type: equal values get different VARCHAR texts and different partitions.
    ("DATE", "VARCHAR", ["'2020-01-05'"], ["'2020-1-5'", "'2020-01-05'"]),
    ("TIMESTAMP", "VARCHAR", ["'2020-01-05 00:00:00'"], ["'2020-01-05'"]),
    (
        "UUID",
        "VARCHAR",
        ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"],
        ["'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'"],
    ),
    ("BOOLEAN", "INTEGER", ["true", "false"], ["1", "0"]),
]


def _equal_pairs_hash_alike(lt: str, rt: str, lvals: list[str], rvals: list[str]) -> None:
    con = duckdb.connect()
    con.execute(f"CREATE TABLE l (x {lt})")
    con.execute(f"CREATE TABLE r (y {rt})")
    con.execute("INSERT INTO l VALUES " + ", ".join(f"({v})" for v in lvals))
    con.execute("INSERT INTO r VALUES " + ", ".join(f"({v})" for v in rvals))
    h = common_hash_type(lt, rt)
    matches = con.execute(
        f"SELECT {hash_sql(['x'], (h,), 1 << 30)}, {hash_sql(['y'], (h,), 1 << 30)}, x::VARCHAR, y::VARCHAR "
        "FROM l JOIN r ON x = y"
    ).fetchall()
    assert matches, "the sample values should contain some pairs DuckDB joins"
    bad = [(x, y) for hx, hy, x, y in matches if hx != hy]
    assert not bad, f"{lt}/{rt} hashed as {h}: equal keys in different partitions: {bad}"


@pytest.mark.parametrize(
    ("lt", "rt", "lvals", "rvals"), _MATCHING, ids=[f"{a}-{b}" for a, b, *_ in _MATCHING]
)
def test_keys_duckdb_joins_hash_to_the_same_partition(lt, rt, lvals, rvals):
    _equal_pairs_hash_alike(lt, rt, lvals, rvals)
    _equal_pairs_hash_alike(rt, lt, rvals, lvals)


@pytest.mark.parametrize(("lt", "rt", "lvals", "rvals"), _MIXED, ids=[f"{a}-{b}" for a, b, *_ in _MIXED])
def test_mixed_type_keys_duckdb_joins_hash_to_the_same_partition(lt, rt, lvals, rvals):
    _equal_pairs_hash_alike(lt, rt, lvals, rvals)


# ---- hash agreement between integer widths (property) -------------------------------------------


@FAST
@given(
    st.lists(st.integers(-(2**31), 2**31 - 1) | st.none(), max_size=40),
    st.integers(1, 16),
)
def test_integer_and_bigint_columns_partition_alike(values, n):
    h = common_hash_type("INTEGER", "BIGINT")
    assert _partitions(values, "INTEGER", h, n) == _partitions(values, "BIGINT", h, n)
    # Using each side's own canonical type gives the same function, which is what lets a table hashed
    # on an INTEGER key be co-located with one hashed on a BIGINT key.
    assert _partitions(values, "INTEGER", canonical_hash_type("INTEGER"), n) == _partitions(
        values, "BIGINT", canonical_hash_type("BIGINT"), n
    )


@FAST
@given(st.lists(st.integers(0, 2**15 - 1) | st.none(), max_size=40), st.integers(1, 16))
def test_smallint_and_uinteger_columns_partition_alike(values, n):
    h = common_hash_type("SMALLINT", "UINTEGER")
    parts = {t: _partitions(values, t, h, n) for t in ("SMALLINT", "UINTEGER", "BIGINT", "INTEGER")}
    assert len({tuple(p) for p in parts.values()}) == 1, parts


@FAST
@given(st.lists(st.integers(0, 2**32 - 1), max_size=40), st.integers(1, 16))
def test_uinteger_beyond_integer_range_partitions_like_bigint(values, n):
    h = common_hash_type("UINTEGER", "BIGINT")
    assert _partitions(values, "UINTEGER", h, n) == _partitions(values, "BIGINT", h, n)


@FAST
@given(st.lists(st.integers(-(10**9), 10**9) | st.none(), max_size=40), st.integers(1, 16))
def test_decimal_and_integer_columns_partition_alike(values, n):
    h = common_hash_type("DECIMAL(12,2)", "INTEGER")
    assert _partitions(values, "DECIMAL(12,2)", h, n) == _partitions(values, "INTEGER", h, n)


@FAST
@given(
    st.lists(st.integers(-20, 20) | st.none(), max_size=30),
    st.lists(st.integers(-20, 20) | st.none(), max_size=30),
    st.integers(1, 6),
)
def test_partition_wise_full_join_equals_the_whole_join(left, right, n):
    """Joining partition p of one side only with partition p of the other (INTEGER vs BIGINT keys)
    gives exactly the full outer join: NULL keys never match, but their rows are kept."""
    con = _con()
    lrel, rrel = _column(left, "INTEGER", "a"), _column(right, "BIGINT", "b")
    h = common_hash_type("INTEGER", "BIGINT")
    whole = con.execute(f"SELECT l.i, r.i FROM {lrel} l FULL JOIN {rrel} r ON l.a = r.b").fetchall()
    parted = con.execute(
        f"SELECT l.i, r.i FROM (SELECT *, {hash_sql(['a'], (h,), n)} AS p FROM {lrel}) l "
        f"FULL JOIN (SELECT *, {hash_sql(['b'], (h,), n)} AS p FROM {rrel}) r ON l.a = r.b AND l.p = r.p"
    ).fetchall()
    assert Counter(parted) == Counter(whole)
    # Independent check of the NULL semantics: every NULL-key row appears exactly once, unmatched.
    for side, values in ((0, left), (1, right)):
        for i, v in enumerate(values):
            if v is None:
                rows = [r for r in parted if r[side] == i]
                assert rows == [(i, None) if side == 0 else (None, i)]


# ---- co_located: hash ---------------------------------------------------------------------------


def _h(keys, types, count=4) -> Hashed:
    return Hashed(tuple(keys), tuple(types), count)


def test_hash_same_keys_count_and_types_is_co_located():
    assert co_located(_h(["a"], ["BIGINT"]), _h(["b"], ["BIGINT"]), [("a", "b")], ["BIGINT"])


def test_hash_on_integer_and_bigint_keys_is_co_located():
    # An INTEGER key and a BIGINT key both hash as BIGINT, and so does the pair.
    lt, rt = canonical_hash_type("INTEGER"), canonical_hash_type("BIGINT")
    pair = common_hash_type("INTEGER", "BIGINT")
    assert co_located(_h(["a"], [lt]), _h(["b"], [rt]), [("a", "b")], [pair])


def test_hash_on_a_subset_of_the_join_keys_is_co_located():
    pairs = [("x", "y"), ("a", "b")]
    assert co_located(_h(["a"], ["BIGINT"]), _h(["b"], ["BIGINT"]), pairs, ["VARCHAR", "BIGINT"])
    assert co_located(
        _h(["a", "x"], ["BIGINT", "VARCHAR"]),
        _h(["b", "y"], ["BIGINT", "VARCHAR"]),
        pairs,
        ["VARCHAR", "BIGINT"],
    )


def test_hash_keys_paired_crosswise_are_not_co_located():
    pairs = [("x", "y"), ("a", "b")]
    types = ["BIGINT", "BIGINT"]
    assert not co_located(_h(["a", "x"], types), _h(["y", "b"], types), pairs, types)


def test_hash_on_a_column_that_is_not_a_join_key_is_not_co_located():
    assert not co_located(_h(["a"], ["BIGINT"]), _h(["c"], ["BIGINT"]), [("a", "b")], ["BIGINT"])
    assert not co_located(
        _h(["a", "z"], ["BIGINT"] * 2), _h(["b", "b"], ["BIGINT"] * 2), [("a", "b")], ["BIGINT"]
    )


@pytest.mark.parametrize(("lc", "rc"), [(4, 3), (3, 4), (1, 2), (8, 4)])
def test_hash_with_different_partition_counts_is_not_co_located(lc, rc):
    assert not co_located(_h(["a"], ["BIGINT"], lc), _h(["b"], ["BIGINT"], rc), [("a", "b")], ["BIGINT"])


@pytest.mark.parametrize(
    ("lt", "rt", "pair"),
    [
        ("BIGINT", "HUGEINT", "HUGEINT"),  # the tables hash differently
        ("BIGINT", "BIGINT", "HUGEINT"),  # both alike, but the join compares as HUGEINT (e.g. UBIGINT key)
        ("BIGINT", "DOUBLE", "DOUBLE"),
        ("VARCHAR", "BIGINT", "DOUBLE"),
    ],
)
def test_hash_with_mismatched_types_is_not_co_located(lt, rt, pair):
    assert not co_located(_h(["a"], [lt]), _h(["b"], [rt]), [("a", "b")], [pair])


@pytest.mark.parametrize(
    "other",
    [Arbitrary(), Replicated(), Single(), Ranged("b", "BIGINT", ((0, 9), (10, 19), (20, 29), (30, 39)))],
)
def test_hash_against_any_other_partitioning_is_not_co_located(other):
    h = _h(["a"], ["BIGINT"])
    assert not co_located(h, other, [("a", "b")], ["BIGINT"])
    assert not co_located(other, _h(["b"], ["BIGINT"]), [("a", "b")], ["BIGINT"])


# ---- co_located: ranges -------------------------------------------------------------------------


def _r(key, bounds, key_type="BIGINT") -> Ranged:
    return Ranged(key, key_type, tuple(bounds))


ALIGNED_CASES = [
    ([(0, 9), (10, 19), (20, 29)], [(0, 9), (10, 19), (20, 29)]),
    ([(0, 9), (10, 19), (20, 29)], [(2, 5), (12, 19), (21, 25)]),  # narrower ranges inside
    ([(0, 9), None, (20, 29)], [(0, 9), (10, 19), (20, 29)]),  # an empty partition
    ([None, None], [(0, 9), (10, 19)]),  # all empty
    ([(0, 9), (15, 19)], [(0, 12), (13, 19)]),  # overlap only in values that occur on one side only
]
MISALIGNED_CASES = [
    ([(0, 9), (10, 19)], [(0, 12), (13, 19)]),
    ([(0, 9), (10, 19)], [(10, 19), (0, 9)]),  # same ranges, other partition numbers
    ([None, (0, 9)], [(0, 9), None]),
    ([(0, 9), (10, 19), (20, 29)], [(0, 9), (10, 20), (21, 29)]),  # touching at one value
]


@pytest.mark.parametrize(("a", "b"), ALIGNED_CASES)
def test_aligned_ranges_are_co_located(a, b):
    assert ranges_aligned(_r("x", a), _r("y", b))
    assert ranges_aligned(_r("y", b), _r("x", a))
    assert co_located(_r("x", a), _r("y", b), [("x", "y")], ["BIGINT"])


@pytest.mark.parametrize(("a", "b"), MISALIGNED_CASES)
def test_misaligned_ranges_are_not_co_located(a, b):
    assert not ranges_aligned(_r("x", a), _r("y", b))
    assert not ranges_aligned(_r("y", b), _r("x", a))
    assert not co_located(_r("x", a), _r("y", b), [("x", "y")], ["BIGINT"])


def test_ranges_with_different_counts_or_key_types_are_not_aligned():
    assert not ranges_aligned(_r("x", [(0, 9), (10, 19)]), _r("y", [(0, 9), (10, 19), (20, 29)]))
    assert ranges_aligned(_r("x", [(0, 9)], "INTEGER"), _r("y", [(0, 9)], "BIGINT"))
    import datetime as dt

    d = [(dt.date(2020, 1, 1), dt.date(2020, 12, 31))]
    assert not ranges_aligned(_r("x", d, "DATE"), _r("y", d, "TIMESTAMP"))


def test_aligned_ranges_on_a_column_that_is_not_a_join_key_are_not_co_located():
    bounds = [(0, 9), (10, 19)]
    assert not co_located(_r("x", bounds), _r("y", bounds), [("x", "z")], ["BIGINT"])
    assert not co_located(_r("x", bounds), _r("y", bounds), [("y", "x")], ["BIGINT"])


def test_string_ranges_align_by_string_order():
    a = _r("x", [("a", "fz"), ("g", "mz"), ("n", "z")], "VARCHAR")
    b = _r("y", [("b", "f"), ("h", "m"), ("o", "zz")], "VARCHAR")
    c = _r("y", [("b", "h"), ("i", "m"), ("o", "zz")], "VARCHAR")
    assert ranges_aligned(a, b)
    assert not ranges_aligned(a, c)


_bounds = st.lists(
    st.none() | st.tuples(st.integers(0, 40), st.integers(0, 12)).map(lambda t: (t[0], t[0] + t[1])),
    min_size=1,
    max_size=5,
)


@given(_bounds, _bounds)
def test_ranges_aligned_matches_brute_force(a, b):
    """Aligned iff no key value can lie in partition p on one side and q != p on the other."""
    universe = range(0, 60)
    expected = len(a) == len(b) and all(
        p == q
        for v in universe
        for p, ra in enumerate(a)
        if ra is not None and ra[0] <= v <= ra[1]
        for q, rb in enumerate(b)
        if rb is not None and rb[0] <= v <= rb[1]
    )
    assert ranges_aligned(_r("x", a), _r("y", b)) == expected
    assert co_located(_r("x", a), _r("y", b), [("x", "y")], ["BIGINT"]) == expected


@given(st.lists(st.integers(0, 200), min_size=1, max_size=40, unique=True), st.integers(1, 40))
def test_partition_groups_cover_each_partition_once(owned, runs):
    from duckflock.exec.stages.partition_runs import _deal

    runs = min(runs, len(owned))
    groups = _deal(sorted(owned), runs)
    assert len(groups) == runs and all(groups)
    assert sorted(p for g in groups for p in g) == sorted(owned)
    assert max(map(len, groups)) - min(map(len, groups)) <= 1


def test_partition_runs_need_one_partitioning():
    from duckflock.exec.stages.partition_runs import _alike

    bounds = ((1, 5), None, (9, 12))
    assert _alike(Hashed(("a",), ("BIGINT",), 6), Hashed(("b",), ("BIGINT",), 6))
    assert not _alike(Hashed(("a",), ("BIGINT",), 6), Hashed(("a",), ("BIGINT",), 4))
    assert not _alike(Hashed(("a",), ("BIGINT",), 6), Hashed(("a",), ("VARCHAR",), 6))
    assert _alike(Ranged("a", "INTEGER", bounds), Ranged("b", "BIGINT", bounds))
    # Aligned but different bounds put a key in a gap of one into different partitions: not alike.
    assert not _alike(Ranged("a", "BIGINT", bounds), Ranged("a", "BIGINT", ((1, 6), None, (9, 12))))
    assert not _alike(Hashed(("a",), ("BIGINT",), 3), Ranged("a", "BIGINT", bounds))


# ---- range tables as the catalog describes them ------------------------------------------------


def _range_table(bounds) -> TableInfo:
    parts = tuple(
        PartitionInfo((f"t/{i}.parquet",), 0 if b is None else 5, *(b or (None, None)))
        for i, b in enumerate(bounds)
    )
    return TableInfo("t", "parquet", (("k", "BIGINT"),), parts, kind="range", keys=("k",))


@pytest.mark.parametrize(
    ("bounds", "ranged"),
    [
        ([(0, 9), (10, 19), None, (20, 29)], True),
        ([(10, 19), (0, 9)], True),  # any order of disjoint ranges
        ([(1, 1), (1, 2)], False),  # a key cut between two partitions: its rows would not meet
        ([(0, 9), (5, 19)], False),
        ([(0, 9), ("a", "b")], False),  # values that do not compare
        ([(5, 1)], False),
    ],
)
def test_a_range_table_is_trusted_only_with_disjoint_ranges(bounds, ranged):
    assert isinstance(_range_table(bounds).partitioning(), Ranged) == ranged


def test_rows_routed_into_ranges_put_null_keys_where_the_loader_does():
    con = duckdb.connect()
    target = Ranged("k", "BIGINT", ((0, 9), (10, 19), (20, 29)))
    routed = con.execute(f"SELECT {partition_sql(('CAST(NULL AS BIGINT)',), target)}").fetchall()[0][0]
    loaded = con.execute(
        f"SELECT {range_partition_sql('k', 'BIGINT', ['9', '19'])} FROM (SELECT CAST(NULL AS BIGINT) AS k)"
    ).fetchall()[0][0]
    assert routed == loaded == 0


def _disjoint_bounds(draw_ranges: list[tuple[int, int] | None]) -> list[tuple[int, int] | None]:
    """Ranges made disjoint and ascending in partition order (as a loaded range table's are)."""
    out: list[tuple[int, int] | None] = []
    floor = -1
    for r in draw_ranges:
        if r is None:
            out.append(None)
            continue
        lo = floor + 1 + r[0]
        out.append((lo, lo + r[1]))
        floor = lo + r[1]
    return out


_RANGES = st.lists(
    st.one_of(st.none(), st.tuples(st.integers(0, 4), st.integers(0, 4))), min_size=2, max_size=3
)


@given(_RANGES, _RANGES)
@settings(max_examples=60)
def test_routed_side_is_aligned_only_where_duckdb_routing_meets_the_other_ranges(a, b):
    """Keys sent into a's ranges (by the SQL the exchange runs, in DuckDB) include keys outside them;
    where the routed side counts as aligned with b, every key b holds is in b's partition number."""
    a_bounds, b_bounds = _disjoint_bounds(a), _disjoint_bounds(b)
    if len(a_bounds) != len(b_bounds):
        return
    target = _r("k", a_bounds)
    routed = Ranged("k", "BIGINT", tuple(a_bounds), routed=True)
    sql = f"SELECT k, {partition_sql(('k',), target)} AS p FROM range(-2, 40) t(k)"
    placed = dict(duckdb.sql(sql).fetchall())
    meets = all(
        placed[k] == q for q, r in enumerate(b_bounds) if r is not None for k in range(r[0], r[1] + 1)
    )
    if ranges_aligned(routed, _r("y", b_bounds)):
        assert meets
    assert ranges_aligned(routed, _r("y", b_bounds)) == ranges_aligned(_r("y", b_bounds), routed)


# ---- splitters chosen from every rank's sample ----------------------------------------------------


def _splitters_of_ranks(sources: list[str], count: int) -> list[str]:
    """The load's splitters on key ``x`` where rank ``r`` reads ``sources[r]``: each rank's sample
    first, then the splitters every rank picks from all of them."""
    con = _con()
    samples: list[object] = []
    for source in sources:
        range_splitters(con, lambda own: samples.append(own) or [own], source, "x", "BIGINT", count)
    return range_splitters(con, lambda _: samples, None, "x", "BIGINT", count)


def test_a_rank_with_few_rows_does_not_pull_the_splitters_toward_its_keys():
    # Rank 0 holds 1,000 rows, rank 1 100,000: both send a sample of about 1,000 keys. Counted
    # alike, the samples would put the first splitter among rank 0's keys, below 1,000.
    few = "(SELECT i AS x FROM range(1000) r(i))"
    many = "(SELECT 1000 + i AS x FROM range(100000) r(i))"
    splitters = [int(s) for s in _splitters_of_ranks([few, many], 4)]
    whole = f"(SELECT * FROM {few} UNION ALL SELECT * FROM {many})"
    exact = _con().execute(f"SELECT quantile_disc(x, [0.25, 0.5, 0.75]) FROM {whole}").fetchall()[0][0]
    for got, want in zip(splitters, exact, strict=True):
        assert abs(got - want) < 5000, (splitters, exact)  # within 5% of the rows of the quantile


def test_null_keys_take_no_share_of_the_splitters():
    rel = "(SELECT CASE WHEN i % 3 = 0 THEN NULL ELSE i END AS x FROM range(3000) r(i))"
    splitters = _splitters_of_ranks([rel], 3)
    assert len(splitters) == 2 and all(s is not None for s in splitters)
    counts = (
        _con()
        .execute(
            f"SELECT {range_partition_sql('x', 'BIGINT', splitters)} AS p, count(*) FROM {rel} WHERE x IS NOT NULL "
            "GROUP BY p ORDER BY p"
        )
        .fetchall()
    )
    assert [p for p, _ in counts] == [0, 1, 2] and all(abs(n - 667) < 100 for _, n in counts)
