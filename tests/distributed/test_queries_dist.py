"""TPC-H joins on 1-4 real MPI ranks, each compared with single-process DuckDB (the small-table
queries live in tests/sql)."""

from __future__ import annotations

import pytest

from duckflock.testing.tpch import SEED_ORDER, SEED_QUERY
from support import assert_same, oracle, run_on_ranks

pytestmark = pytest.mark.dist

TPCH_JOINS: list[tuple[str, list[str]]] = [
    (SEED_QUERY, SEED_ORDER),
    (
        "SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) AS revenue, o_orderdate, o_shippriority "
        "FROM customer, orders, lineitem WHERE c_mktsegment = 'BUILDING' AND c_custkey = o_custkey "
        "AND l_orderkey = o_orderkey AND o_orderdate < DATE '1995-03-15' AND l_shipdate > DATE '1995-03-15' "
        "GROUP BY l_orderkey, o_orderdate, o_shippriority ORDER BY revenue DESC, o_orderdate, l_orderkey LIMIT 10",
        ["revenue", "o_orderdate", "l_orderkey"],
    ),
    (
        "SELECT n_name, sum(l_extendedprice * (1 - l_discount)) AS revenue FROM customer, orders, lineitem, "
        "supplier, nation, region WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND l_suppkey = s_suppkey "
        "AND c_nationkey = s_nationkey AND s_nationkey = n_nationkey AND n_regionkey = r_regionkey "
        "AND r_name = 'ASIA' AND o_orderdate >= DATE '1994-01-01' AND o_orderdate < DATE '1995-01-01' "
        "GROUP BY n_name ORDER BY revenue DESC",
        ["revenue"],
    ),
    (
        "SELECT ps_partkey, count(*) AS n, sum(ps_supplycost * ps_availqty) AS v FROM partsupp JOIN part "
        "ON p_partkey = ps_partkey WHERE p_size > 20 GROUP BY ps_partkey ORDER BY v DESC, ps_partkey LIMIT 20",
        ["v", "ps_partkey"],
    ),
    (
        "SELECT o_orderpriority, count(*) AS order_count FROM orders JOIN lineitem ON l_orderkey = o_orderkey "
        "WHERE l_commitdate < l_receiptdate GROUP BY o_orderpriority ORDER BY o_orderpriority",
        ["o_orderpriority"],
    ),
]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_tpch_joins_match_duckdb(tpch_dir, tmp_path, ranks):
    results = run_on_ranks(tpch_dir, ranks, [q for q, _ in TPCH_JOINS], tmp_path)
    ref = oracle(tpch_dir)
    for (query, order), got in zip(TPCH_JOINS, results, strict=True):
        assert not isinstance(got, str), f"{query}\n{got}"
        assert_same(got, ref.sql(query).to_arrow_table(), order)


# Rows split by target with strings among the columns, a skewed key spread over the ranks, ORDER BY
# sorted in parallel by a numeric and by a string key, an AVG finished by duckdb_avg's numpy function:
# every rank-side path that builds Arrow arrays.
ARRAY_PATHS: list[tuple[str, list[str] | None]] = [
    ("SELECT count(*) AS n, max(l_comment || ps_comment) AS m FROM lineitem JOIN partsupp "
     "ON l_partkey = ps_partkey AND l_suppkey = ps_suppkey", None),
    ("SELECT count(*) AS n, max(p_name || l_comment) AS m FROM lineitem JOIN part "
     "ON (CASE WHEN l_orderkey % 2 = 0 THEN 1 ELSE l_partkey END) = p_partkey", None),
    ("SELECT o_orderkey, o_totalprice, o_comment FROM orders ORDER BY o_totalprice, o_orderkey",
     ["o_totalprice", "o_orderkey"]),
    ("SELECT o_orderkey, o_comment FROM orders ORDER BY o_comment, o_orderkey", ["o_comment", "o_orderkey"]),
    ("SELECT o_orderstatus, avg(o_totalprice) AS a FROM orders GROUP BY o_orderstatus", None),
]  # fmt: skip


def test_ranks_never_import_pandas(tpch_dir, tmp_path):
    """pyarrow's conversions from numpy and Python objects import pandas on first use, where it is
    installed: a third of a second and 40 MB in each rank. Ranks build their arrays from buffers."""
    env = {
        "DUCKFLOCK_BROADCAST_THRESHOLD_BYTES": "0",
        "DUCKFLOCK_RANGE_SORT_THRESHOLD_BYTES": "0",
        "DUCKFLOCK_SKEW_MIN_ROWS": "1000",
    }
    results = run_on_ranks(tpch_dir, 2, [q for q, _ in ARRAY_PATHS], tmp_path, env)
    ref = oracle(tpch_dir)
    for (query, order), got in zip(ARRAY_PATHS, results, strict=True):
        assert not isinstance(got, str), f"{query}\n{got}"
        assert_same(got, ref.sql(query).to_arrow_table(), order)
    for rank in range(2):
        loaded = (tmp_path / f"rank{rank}.modules").read_text().split()
        assert "pyarrow" in loaded and "pandas" not in loaded, rank
