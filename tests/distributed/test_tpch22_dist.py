"""All 22 TPC-H queries as distributed plans on 2 and 3 ranks, compared with single-process DuckDB."""

from __future__ import annotations

import pytest

from duckflock.testing.tpch import ORDER, queries
from support import assert_same, oracle, run_on_ranks

pytestmark = pytest.mark.dist


@pytest.mark.parametrize("ranks", [2, 3])
def test_tpch_22_match_duckdb(tpch_dir, tmp_path, ranks):
    qs = queries()
    results = run_on_ranks(tpch_dir, ranks, list(qs.values()), tmp_path)
    ref = oracle(tpch_dir)
    failures = []
    for (n, q), got in zip(qs.items(), results, strict=True):
        if isinstance(got, str):
            failures.append(f"Q{n}: {got}")
            continue
        try:
            assert_same(got, ref.sql(q).to_arrow_table(), ORDER.get(n))
        except AssertionError as e:
            failures.append(f"Q{n}: {str(e)[:300]}")
    assert not failures, "\n".join(failures)
