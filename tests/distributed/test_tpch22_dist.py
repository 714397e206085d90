"""All 22 TPC-H queries as distributed plans on 2 and 3 ranks, compared with single-process DuckDB."""

from __future__ import annotations

import pytest

from duckflock.bench.tpch import queries
from support import assert_same, oracle, run_on_ranks

pytestmark = pytest.mark.dist

# Output columns whose sequence each query's ORDER BY fixes (ties aside, checked as multisets).
ORDER = {
    1: ["l_returnflag", "l_linestatus"],
    2: ["s_acctbal"],
    3: ["revenue"],
    4: ["o_orderpriority"],
    5: ["revenue"],
    7: ["supp_nation", "cust_nation", "l_year"],
    8: ["o_year"],
    9: ["nation", "o_year"],
    10: ["revenue"],
    11: ["value"],
    12: ["l_shipmode"],
    13: ["custdist", "c_count"],
    15: ["s_suppkey"],
    16: ["supplier_cnt"],
    18: ["o_totalprice"],
    20: ["s_name"],
    21: ["numwait"],
    22: ["cntrycode"],
}


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
