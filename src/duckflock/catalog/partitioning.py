"""How rows of a relation are spread over partitions and ranks.

One set of types serves the catalog (how a stored table is split) and the planner (how an intermediate
result is split), so a table already partitioned on a join key is recognised and not shuffled again.
Partition ``p`` of any table lives on rank ``p % ranks``; that is what makes equal partition numbers of
two tables meet on the same rank for any rank count.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any


def partitions_of_rank(count: int, rank: int, size: int) -> list[int]:
    """The partitions of ``count`` that live on ``rank`` of ``size`` ranks."""
    return [p for p in range(count) if p % size == rank]


_SMALL_INTS = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER"}
_BIG_INTS = {"UBIGINT", "HUGEINT"}
_FLOATS = ("FLOAT", "REAL", "FLOAT4")  # DuckDB's names of a 4-byte float
_NUMERIC = {"BIGINT", "HUGEINT", "DOUBLE"}  # canonical hash types of numbers
_NUMERIC_PREFIXES = ("DECIMAL", "NUMERIC", "FLOAT", "DOUBLE", "REAL")
# Hashed as they are: not text, though DuckDB casts a string to them to compare ('007' meets BIGNUM
# 7, '12:00:00+00' meets TIMETZ '12:00:00.000+00:00'), so their text would not meet the string.
_OWN = {"BIGNUM", "VARINT", "TIME WITH TIME ZONE", "TIMETZ"}
# Compared by value in ways neither their text nor a cast captures (VARIANT 1 equals VARIANT 1.00;
# a GEOMETRY equals a string spelling its WKT otherwise): rows are never spread by them.
_UNSPREADABLE = ("VARIANT", "GEOMETRY")


def is_nested_type(t: str) -> bool:
    """LIST, ARRAY, STRUCT, MAP or UNION (upper case)."""
    return t.endswith("]") or t.startswith(("STRUCT", "MAP", "UNION"))


def check_spreadable(duckdb_type: str) -> None:
    """Raise ValueError for a type rows must not be hashed or ranged by (_UNSPREADABLE)."""
    if any(u in duckdb_type.upper() for u in _UNSPREADABLE):
        raise ValueError(
            f"rows are not spread by {duckdb_type} values: DuckDB compares them by value, not by text"
        )


def canonical_hash_type(duckdb_type: str) -> str:
    """The type a key column is cast to before hashing, so equal values hash alike on every side."""
    check_spreadable(duckdb_type)
    t = duckdb_type.upper()
    if is_nested_type(t):
        # As it is: DuckDB's hash of a nested value hashes equal values alike (-0.0 and 0.0 too),
        # where its text would not ('[-0.0]' and '[0.0]').
        return duckdb_type
    if t == "UHUGEINT":  # over HUGEINT's range: hashed as it is
        return t
    if t in _SMALL_INTS:
        return "BIGINT"
    if t in _BIG_INTS:
        return "HUGEINT"
    if t.startswith(_NUMERIC_PREFIXES):
        return "DOUBLE"
    # An instant: the same in every zone (TIMESTAMPTZ_NS has no cast to TIMESTAMP).
    if t in ("TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ", "TIMESTAMPTZ_NS"):
        return "TIMESTAMP WITH TIME ZONE"
    if t.startswith("TIMESTAMP"):
        return "TIMESTAMP"
    if t in ("VARCHAR", "DATE", "BOOLEAN", "UUID", "BLOB", "TIME", "INTERVAL") or t in _OWN:
        return t
    return "VARCHAR"


def common_hash_type(left: str, right: str) -> str:
    """The hash type for a join key pair of possibly different types: the type DuckDB compares
    them in, or one that maps values equal in it to equal values."""
    a, b = canonical_hash_type(left), canonical_hash_type(right)
    numbers = _number_pair_type(left.upper(), right.upper(), a, b)
    if numbers:
        return numbers
    if a == b:
        return a
    if "VARCHAR" in (a, b):
        # DuckDB compares a string (or JSON, ...) with a typed value in that value's own type: it
        # casts '7.5' to INTEGER 8 to compare it with an INTEGER, to DECIMAL(12,3) 1.000 with a
        # DECIMAL(12,3).
        return right if a == "VARCHAR" else left
    if a in _OWN or b in _OWN:
        if {a, b} <= {"TIME", "TIME WITH TIME ZONE", "TIMETZ"}:
            return "TIME"  # DuckDB compares them as TIMETZ: equal pairs have the same time of day
        # BIGNUM against other numbers: which type DuckDB compares them in is not worked out here.
        raise ValueError(f"no common hash type of {left} and {right}")
    if is_nested_type(a) or is_nested_type(b) or "UHUGEINT" in (a, b):
        return _supertype(left, right)
    if {a, b} <= {"BIGINT", "HUGEINT"}:
        return "HUGEINT"
    if a in _NUMERIC and b in _NUMERIC:
        return "DOUBLE"
    if {a, b} == {"DATE", "TIMESTAMP"}:
        return "TIMESTAMP"
    if "TIMESTAMP WITH TIME ZONE" in (a, b) and {a, b} <= {"DATE", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE"}:
        return "TIMESTAMP WITH TIME ZONE"  # DuckDB casts the other side to it, in the session's zone
    if "BOOLEAN" in (a, b) and (a in _NUMERIC or b in _NUMERIC):
        return "DOUBLE" if "DOUBLE" in (a, b) else "BIGINT"
    return "VARCHAR"


def _number_pair_type(left: str, right: str, a: str, b: str) -> str | None:
    """The hash type of two number types (``a``, ``b``: their canonical ones) that DuckDB compares
    otherwise than as DOUBLEs, if they are such a pair.

    A FLOAT with an integer or DECIMAL: as FLOAT, the other side rounds to it (16777217 meets
    16777216.0, DECIMAL 0.1 meets FLOAT 0.1). A DECIMAL with another DECIMAL type or an integer:
    DECIMAL(38, the larger scale), as DuckDB compares them exactly, while their DOUBLE forms need
    not meet (a DECIMAL(38,0) or HUGEINT converts to DOUBLE otherwise than a DECIMAL(38,2) or
    BIGINT of the same value). A value that does not fit fails DuckDB's comparison cast too."""
    floats = [t in _FLOATS for t in (left, right)]
    other = right if floats[0] else left
    if any(floats) and {a, b} <= _NUMERIC | {"UHUGEINT"} and other not in ("DOUBLE", *_FLOATS):
        return "FLOAT"
    if left == right or not (_is_decimal(left) or _is_decimal(right)):
        return None
    if not all(t in _EXACT_INTS or _is_decimal(t) for t in (left, right)):
        return None
    return f"DECIMAL(38,{max(_decimal_scale(left), _decimal_scale(right))})"


_EXACT_INTS = _SMALL_INTS | _BIG_INTS


def _is_decimal(t: str) -> bool:
    return t.startswith(("DECIMAL", "NUMERIC"))


def _decimal_scale(t: str) -> int:
    """The scale of DECIMAL(w,s) (0 for DECIMAL(w), an integer type); DECIMAL alone is (18,3)."""
    if not _is_decimal(t):
        return 0
    if "(" not in t:
        return 3
    inside = t[t.index("(") + 1 : t.index(")")].split(",")
    return int(inside[1]) if len(inside) > 1 else 0


@functools.lru_cache(maxsize=256)
def _supertype(a: str, b: str) -> str:
    """The type a UNION of types ``a`` and ``b`` takes, which DuckDB also compares nested values
    (and UHUGEINT with other integers) in: each side is cast to it before hashing."""
    import duckdb  # on first use: reading a catalog needs no DuckDB

    with duckdb.connect() as con:
        union = f"SELECT CAST(NULL AS {a}) AS v UNION ALL SELECT CAST(NULL AS {b})"
        try:
            return str(con.execute(f"SELECT typeof(v) FROM ({union}) LIMIT 1").fetchall()[0][0])
        except duckdb.Error as e:  # no common type: the planner refuses (the driver may answer)
            raise ValueError(f"no common type of {a} and {b}: {e}") from None


@dataclass(frozen=True)
class Hashed:
    """Row with key k is in partition hash(k cast to key_types) % count."""

    keys: tuple[str | None, ...]  # the key columns; None where a key is an expression, not a column
    key_types: tuple[str, ...]
    count: int

    def describe(self) -> str:
        return f"hash({', '.join(k or '?' for k in self.keys)}) % {self.count}"


@dataclass(frozen=True)
class Ranged:
    """Partition p holds keys in the closed interval bounds[p] (None for an empty partition).

    ``routed``: the rows were sent into another table's ranges (catalog/placement.py's partition_sql),
    which puts keys outside every range somewhere too: a key goes to the partition with the
    smallest upper bound not below it, else to the one with the largest; every key to partition 0
    where all are empty. Such keys survive an outer or anti join, so the intervals are open-ended."""

    key: str | None  # None where the key is an expression, not a column
    key_type: str
    bounds: tuple[tuple[Any, Any] | None, ...]  # values of the key's type
    routed: bool = False

    @property
    def count(self) -> int:
        return len(self.bounds)

    def describe(self) -> str:
        return f"range({self.key or '?'}) x {self.count}"


@dataclass(frozen=True)
class Arbitrary:
    """Rows are spread over ranks with no relation to their values."""

    def describe(self) -> str:
        return "arbitrary"


@dataclass(frozen=True)
class Replicated:
    """Every rank holds every row."""

    def describe(self) -> str:
        return "replicated"


@dataclass(frozen=True)
class Single:
    """All rows are on the driver (rank 0)."""

    def describe(self) -> str:
        return "single"


Partitioning = Hashed | Ranged | Arbitrary | Replicated | Single


def ranges_aligned(a: Ranged, b: Ranged) -> bool:
    """True when every key value that occurs on both sides lies in the same partition number."""
    if a.count != b.count or canonical_hash_type(a.key_type) != canonical_hash_type(b.key_type):
        return False
    if _floating(a.key_type) != _floating(b.key_type) or (
        _floating(a.key_type) and a.key_type.upper() != b.key_type.upper()
    ):
        # DuckDB compares DECIMAL 0.1 and DOUBLE 0.1 (or FLOAT 0.1) as equal, in the float type;
        # the bounds, compared here as Python values, are not.
        return False
    ia, ib = _intervals(a), _intervals(b)
    for p, ra in enumerate(ia):
        for q, rb in enumerate(ib):
            if p != q and ra is not None and rb is not None and not (_below(ra, rb) or _below(rb, ra)):
                return False
    return True


def _floating(t: str) -> bool:
    return t.upper() in ("DOUBLE", "FLOAT8", *_FLOATS)


# A partition's keys: (low, low excluded, high), None for no bound on that end.
_Interval = tuple[Any, bool, Any]


def _intervals(r: Ranged) -> list[_Interval | None]:
    if not r.routed:
        return [None if b is None else (b[0], False, b[1]) for b in r.bounds]
    out: list[_Interval | None] = [None] * r.count
    ends = sorted((b[1], p) for p, b in enumerate(r.bounds) if b is not None)
    if not ends:
        out[0] = (None, False, None)
    previous = None
    for i, (hi, p) in enumerate(ends):
        out[p] = (previous, previous is not None, None if i == len(ends) - 1 else hi)
        previous = hi
    return out


def _below(x: _Interval, y: _Interval) -> bool:
    """Every key of ``x`` is below every key of ``y``."""
    hi, (lo, lo_excluded) = x[2], y[:2]
    return hi is not None and lo is not None and (hi < lo or (hi == lo and lo_excluded))


def co_located(
    left: Partitioning, right: Partitioning, pairs: list[tuple[str, str]], key_types: list[str]
) -> bool:
    """Whether an equi-join on ``pairs`` (left col, right col) can run without moving rows.

    ``key_types`` holds each pair's common hash type (see ``common_hash_type``).
    Hash: both sides hashed on the same subset of the key pairs, in the same order, with the same count
    and hash types. Range: both sides range-partitioned on one key pair with aligned bounds.
    """
    if isinstance(left, Hashed) and isinstance(right, Hashed):
        if left.count != right.count or len(left.keys) != len(right.keys):
            return False
        for lk, rk, lt, rt in zip(left.keys, right.keys, left.key_types, right.key_types, strict=True):
            matches = [i for i, (pl, pr) in enumerate(pairs) if pl == lk and pr == rk]
            if not matches or not lt == rt == key_types[matches[0]]:
                return False
        return True
    if isinstance(left, Ranged) and isinstance(right, Ranged):
        return (left.key, right.key) in pairs and ranges_aligned(left, right)
    return False
