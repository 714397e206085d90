"""Where a row lives: the one place that says which partition or rank a row goes to.

The co-location invariant — a row is where the catalog says it is — holds only if loading a table
(ingest/), routing rows into its partitions at query time (the planner's exchanges, exec/) and
checking a stored table against this DuckDB (the canary) all place rows by the same function. They
all take it from here:

* hash placement: DuckDB's ``hash()`` of the keys cast to their canonical hash types, modulo the
  partition count (``hash_sql``, ``partition_sql``, ``target_sql``);
* range placement: a loaded table's partitions split at sampled splitters (``range_partition_sql``),
  and rows routed into a stored table's recorded bounds (``partition_sql``);
* splitters: each rank samples its keys, every rank sees all samples and picks the same weighted
  quantiles (``choose_splitters``), for a load's ranges and a parallel sort's ranks alike;
* the canary: whether this DuckDB's ``hash()`` still places rows where a stored table has them.

Partition ``p`` lives on rank ``p % ranks`` (catalog/partitioning.py).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from duckflock.catalog.partitioning import Hashed, Partitioning, Ranged, canonical_hash_type, is_nested_type
from duckflock.sqltext import quote_ident as q
from duckflock.sqltext import sql_literal

if TYPE_CHECKING:  # imported where used: reading a catalog needs neither
    import duckdb
    import pyarrow as pa
    from numpy.typing import ArrayLike

# ---- hash placement ----------------------------------------------------------------------------


def hash_sql(key_sql: list[str], key_types: tuple[str, ...], count: int) -> str:
    """SQL computing the partition number of a row: DuckDB's deterministic hash of the cast keys."""
    casts = ", ".join(f"CAST({k} AS {t})" for k, t in zip(key_sql, key_types, strict=True))
    return f"(hash({casts}) % {count})"


def key_hash_sql(keys: tuple[str, ...], target: Hashed) -> str:
    """DuckDB's deterministic hash of a row's ``keys`` cast to ``target``'s key types (as they are
    when it has none): what places the row in ``target``."""
    if all(t == "" for t in target.key_types):  # hashed as they are, no cast
        return f"hash({', '.join(keys)})"
    casts = ", ".join(f"CAST({k} AS {t})" for k, t in zip(keys, target.key_types, strict=True))
    return f"hash({casts})"


def join_key_hash(keys: tuple[str, ...], target: Partitioning) -> str:
    """The hash naming a join key: as ``target`` hashes it, or for a range, of the key in its
    canonical type (both sides of a join name a key alike)."""
    if isinstance(target, Ranged):
        target = Hashed((target.key,), (canonical_hash_type(target.key_type),), target.count)
    assert isinstance(target, Hashed)
    return key_hash_sql(keys, target)


# ---- a row's partition and rank ------------------------------------------------------------------


def range_partition_sql(key: str, key_type: str, splitters: list[str]) -> str:
    """Partition of a row: the number of splitters below its key. NULL keys go to partition 0."""
    if not splitters:
        return "0"
    k = q(key)
    whens = " ".join(
        f"WHEN {k} <= CAST({sql_literal(s)} AS {key_type}) THEN {i}" for i, s in enumerate(splitters)
    )
    return f"(CASE WHEN {k} IS NULL THEN 0 {whens} ELSE {len(splitters)} END)"


def partition_sql(keys: tuple[str, ...], target: Partitioning) -> str:
    """SQL computing the number of the ``target`` partition each row belongs to, from its ``keys``."""
    if isinstance(target, Hashed):
        return f"({key_hash_sql(keys, target)} % {target.count})"
    if isinstance(target, Ranged):
        # Partition p holds keys up to its upper bound; keys in no partition's range match nothing
        # on the other side, so any partition is correct for them.
        bounds = sorted((b[1], p) for p, b in enumerate(target.bounds) if b is not None)
        if not bounds:  # every partition empty: the other side's keys match nothing anywhere
            return "0"
        # Compare in the key's canonical type: the other side's keys may not fit the range key's type.
        key = f"CAST({keys[0]} AS {canonical_hash_type(target.key_type)})"
        whens = " ".join(f"WHEN {key} <= {sql_literal(hi)} THEN {p}" for hi, p in bounds)
        last = bounds[-1][1]
        # NULL keys where a loaded table keeps them (range_partition_sql): a group of NULLs meets.
        return f"(CASE WHEN {key} IS NULL THEN 0 {whens} ELSE {last} END)"
    raise ValueError(f"no partition function for {target.describe()}")


def target_sql(keys: tuple[str, ...], target: Partitioning, size: int) -> str:
    """SQL computing each row's target rank from its ``keys``, evaluated by DuckDB inside the
    producing query, so that rows land on the rank of ``target`` partition they belong to."""
    return f"CAST({partition_sql(keys, target)} % {size} AS USMALLINT)"


# ---- splitters of a parallel sort ---------------------------------------------------------------

SortKey = tuple[str, bool, bool]  # (expression SQL, descending, nulls first)
SPLITTERS_TABLE = "__splitters"  # one row per splitter: k0, k1, ... and its target __t


def sort_key_sample(table: str, keys: list[SortKey], rows: int) -> str:
    """A repeatable reservoir sample of the sort keys as columns k0, k1, ..."""
    exprs = ", ".join(f"{e} AS k{i}" for i, (e, _, _) in enumerate(keys))
    return f"SELECT {exprs} FROM {table} USING SAMPLE reservoir({rows} ROWS) REPEATABLE (7)"


def ordered_samples(table: str, keys: list[SortKey]) -> str:
    """The sample columns k0, k1, ... of ``table`` in the sort's order."""
    order = ", ".join(
        f"k{i}{' DESC' if d else ''}{' NULLS FIRST' if nf else ' NULLS LAST'}"
        for i, (_, d, nf) in enumerate(keys)
    )
    return f"SELECT * FROM {table} ORDER BY {order}"


def splitter_target_sql(keys: list[SortKey], null_keys: list[list[bool]]) -> str:
    """Each row's target rank: the number of splitters it sorts after. Splitter ``t`` (1-based) is
    read from ``SPLITTERS_TABLE``, so no value is written out as text; ``null_keys[t - 1][i]``
    says whether its key ``i`` is NULL."""
    whens = []
    for target in range(len(null_keys), 0, -1):
        splitter = [
            None if null else f"(SELECT k{i} FROM {SPLITTERS_TABLE} WHERE __t = {target})"
            for i, null in enumerate(null_keys[target - 1])
        ]
        whens.append(f"WHEN {_after(keys, splitter)} THEN {target}")
    return f"CAST(CASE {' '.join(whens)} ELSE 0 END AS USMALLINT)"


# ---- choosing splitters from samples ------------------------------------------------------------
# One method for a load's ranges and a parallel sort's ranks; where the two differed, the stricter:
# * samples are ordered by DuckDB, in their own types (the sort's way): the load sorted Python
#   values, which for structs or lists holding NULLs fails or orders otherwise than DuckDB;
# * each rank's sample weighs the rows it stands for (the load's way): the sort counted every
#   sample row alike, so a rank with few rows pulled the quantiles toward its keys.
# Where a row then goes is unchanged: the load's splitters are the key's text, cast back in
# range_partition_sql, and a stored table's bounds are its rows' min and max, routed to by
# partition_sql as before.

Gather = Callable[[Any], list[Any]]  # a collective: every rank's object, in rank order

# Rows each rank samples per partition of a load: enough that the quantile error per partition is a
# few percent, small enough to allgather cheaply.
_LOAD_SAMPLE_PER_PARTITION = 128


def quantile_picks(weights: ArrayLike, count: int) -> list[int]:
    """Indexes into weighted entries (in key order) of the ``count - 1`` splitters: the first entry
    whose cumulative weight reaches each ``t / count`` of the total. Equal picks leave partitions
    empty (one heavy key)."""
    import numpy as np

    cum = np.cumsum(np.asarray(weights, dtype=np.float64))
    total = float(cum[-1])
    thresholds = [total * t / count for t in range(1, count)]
    last = len(cum) - 1
    return [min(int(i), last) for i in np.searchsorted(cum, thresholds, side="left")]


def choose_splitters(
    con: duckdb.DuckDBPyConnection, gathered: list[tuple[int, pa.Table]], keys: list[SortKey], count: int
) -> pa.Table:
    """The ``count - 1`` splitters of every rank's (rows it has, sample of keys k0, k1, ...):
    columns k0, k1, ... in the samples' types, and the target ``__t`` (1, 2, ...). Every rank
    picks the same from the same gathered samples; at least one must have rows."""
    import numpy as np
    import pyarrow as pa

    # Arrays from buffers: pyarrow's conversions from numpy or Python objects import pandas.
    from duckflock.arrays import arrow_array, numpy_view

    weighted = [
        s.append_column("__w", arrow_array(np.full(s.num_rows, n / s.num_rows)))
        for n, s in gathered
        if s.num_rows
    ]
    con.register("__samples", pa.concat_tables(weighted))
    try:
        ordered = con.sql(ordered_samples("__samples", keys)).to_arrow_table()
    finally:
        con.unregister("__samples")
    picks = quantile_picks(numpy_view(ordered.column("__w")), count)
    splitters = ordered.drop_columns(["__w"]).take(arrow_array(np.asarray(picks, dtype=np.int64)))
    return splitters.append_column("__t", arrow_array(np.arange(1, count, dtype=np.int32)))


def range_splitters(
    con: duckdb.DuckDBPyConnection, gather: Gather, source: str | None, key: str, key_type: str, count: int
) -> list[str]:
    """``count - 1`` splitters of a load's range partitioning on ``key`` (``range_partition_sql``),
    sampled from ``source`` on every rank (None: a rank without inputs); a collective.

    The splitters are ordered by value but kept as the text DuckDB gave each on the rank that read
    it, and cast back to the key's type in the partition SQL: as loads always placed rows. That text
    casts back to the same value for every type a range load takes, where a value's Arrow form may
    not (an INTERVAL past 2,562,047 hours wraps around); and an inline CASE places rows faster than
    splitters read from a registered table."""
    rows, sample = 0, None
    if source is not None:
        k = q(key)
        valid = f"{k} IS NOT NULL"
        if key_type.upper() in ("DOUBLE", "FLOAT", "REAL"):
            valid += f" AND NOT isnan({k})"  # NaN sorts above everything in DuckDB; keep it out of sorting
        rows = con.execute(f"SELECT count(*) FROM {source} WHERE {valid}").fetchall()[0][0]
        size = max(1024, _LOAD_SAMPLE_PER_PARTITION * count)
        keys = f"(SELECT {k} AS k FROM {source} WHERE {valid})"
        sample = con.sql(
            f"SELECT k AS k0, CAST(k AS VARCHAR) AS k_text FROM {keys} "
            f"USING SAMPLE reservoir({size} ROWS) REPEATABLE (42)"
        ).to_arrow_table()
    gathered = [(n, s) for n, s in gather((rows, sample)) if s is not None and s.num_rows]
    if not gathered:
        return []
    return choose_splitters(con, gathered, [("k0", False, False)], count).column("k_text").to_pylist()


def one_target(rank: int = 0) -> str:
    return f"CAST({rank} AS USMALLINT)"


def _after(row: list[SortKey], splitter: list[str | None]) -> str:
    """SQL that is true when the row sorts strictly after the splitter."""
    clause = "FALSE"
    for (expr, desc, nulls_first), s in reversed(list(zip(row, splitter, strict=True))):
        if s is None:
            gt = f"({expr} IS NOT NULL)" if nulls_first else "FALSE"
            eq = f"({expr} IS NULL)"
        else:
            op = "<" if desc else ">"
            gt = (
                f"({expr} IS NOT NULL AND {expr} {op} {s})"
                if nulls_first
                else f"({expr} IS NULL OR {expr} {op} {s})"
            )
            eq = f"COALESCE({expr} = {s}, FALSE)"
        clause = f"({gt} OR ({eq} AND {clause}))"
    return clause


# ---- the hash canary ----------------------------------------------------------------------------
# Rows were placed by DuckDB's hash of the keys when a table was loaded; DuckDB does not promise that
# function across versions (it changed between 1.2 and 1.3). A co-located join over a table placed by
# another hash would silently lose rows, so each hash-partitioned table records a canary: the
# partition its function gives fixed sample keys. Where this DuckDB disagrees, the table is treated
# as not partitioned (shuffled like any other) and the user is told to rewrite it with
# ``duckflock load --repartition``, which places its rows by this DuckDB's hash again.

# One sample key per canonical hash type, and a large modulus so the canary sees most hash bits.
_SAMPLES = {
    "BIGINT": "42",
    "HUGEINT": "170141183460469231731687303715884105727",
    "UHUGEINT": "340282366920938463463374607431768211455",
    "DOUBLE": "4.25",
    "DATE": "DATE '2001-02-03'",
    "TIMESTAMP": "TIMESTAMP '2001-02-03 04:05:06'",
    "TIMESTAMP WITH TIME ZONE": "TIMESTAMPTZ '2001-02-03 04:05:06+00'",
    "BOOLEAN": "true",
    "TIME": "TIME '01:02:03'",
    "INTERVAL": "INTERVAL 3 DAY",
    "UUID": "'00000000-0000-0000-0000-00000000002a'",
    "BLOB": "'duckflock'",
    "BIGNUM": "'-123456789012345678901234567890123456789'",
    "VARINT": "'-123456789012345678901234567890123456789'",
    "TIME WITH TIME ZONE": "'01:02:03+04:30'",
    "TIMETZ": "'01:02:03+04:30'",
}
_MODULUS = 1_000_000_007


@functools.lru_cache(maxsize=256)
def canary(key_types: tuple[str, ...]) -> int:
    """This DuckDB's partition number of the sample keys of these (canonical) types."""
    import duckdb  # on first use: reading a catalog needs no DuckDB

    # A nested type has no sample here, only NULL: a change in how DuckDB hashes nested values
    # would go unnoticed (weak, but a cast of the text sample to it would fail).
    keys = [_SAMPLES.get(t, "NULL" if is_nested_type(t.upper()) else "'duckflock'") for t in key_types]
    with duckdb.connect() as con:
        return int(con.execute(f"SELECT {hash_sql(keys, key_types, _MODULUS)}").fetchall()[0][0])


def trusted(table: str, key_types: tuple[str, ...], recorded: int | None, version: str) -> bool:
    """Whether rows placed with the recorded canary are where this DuckDB's hash puts them."""
    if recorded == canary(key_types):
        return True
    _warn_once(table, version)
    return False


@functools.lru_cache(maxsize=1024)
def _warn_once(table: str, version: str) -> None:
    import duckdb

    made = f"DuckDB {version}" if version else "a DuckDB whose hash was not recorded"
    warnings.warn(
        f"table {table!r} was hash-partitioned by {made}, whose hash() differs from DuckDB "
        f"{duckdb.__version__}'s: it is treated as unpartitioned (shuffled). Rewrite it with "
        "`duckflock load --data DIR --repartition` to join it co-located again.",
        stacklevel=3,
    )
