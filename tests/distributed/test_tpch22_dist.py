"""All 22 TPC-H queries as distributed plans on 2 and 3 ranks, compared with single-process DuckDB.
(Over the storage exchange: tests/distributed/test_storage_dist.py.)"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from duckflock.testing.tpch import ORDER, queries
from support import assert_same, oracle, run_on_ranks

pytestmark = pytest.mark.dist


def assert_22_match(tpch_dir: Path, results: list[pa.Table | str]) -> None:
    """Each query's result (a table, or the text of its error) is DuckDB's; one message for all
    that differ."""
    ref = oracle(tpch_dir)
    failures = []
    for (n, q), got in zip(queries().items(), results, strict=True):
        if isinstance(got, str):
            failures.append(f"Q{n}: {got}")
            continue
        try:
            assert_same(got, ref.sql(q).to_arrow_table(), ORDER.get(n))
        except AssertionError as e:
            failures.append(f"Q{n}: {str(e)[:300]}")
    assert not failures, "\n".join(failures)


# ranks 2: no query may be answered by DuckDB on the driver instead, as none is at SF 1 and above
# (Q15's subquery condition, moved into a join by sqlglot's predicate pushdown, was refused there).
@pytest.mark.parametrize(("ranks", "fallback"), [(2, "0"), (3, None)])
def test_tpch_22_match_duckdb(tpch_dir, tmp_path, ranks, fallback):
    env = {"DUCKFLOCK_DRIVER_FALLBACK_BYTES": fallback} if fallback is not None else None
    assert_22_match(tpch_dir, run_on_ranks(tpch_dir, ranks, list(queries().values()), tmp_path, env))
