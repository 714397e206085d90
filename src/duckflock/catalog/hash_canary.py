"""Whether a table's stored hash partitioning still matches this DuckDB's ``hash()``.

Rows were placed by DuckDB's hash of the keys when the table was loaded; DuckDB does not promise
that function across versions (it changed between 1.2 and 1.3). A co-located join over a table
placed by another hash would silently lose rows, so each hash-partitioned table records a canary:
the partition its function gives fixed sample keys. Where this DuckDB disagrees, the table is
treated as not partitioned (shuffled like any other) and the user is told to rewrite it with
``duckflock load --repartition``, which places its rows by this DuckDB's hash again.
"""

from __future__ import annotations

import functools
import warnings

from duckflock.catalog.partitioning import is_nested_type
from duckflock.plan.sql_text import hash_sql

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
