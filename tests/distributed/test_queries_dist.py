"""Distributed queries on 1-4 real MPI ranks, each compared with single-process DuckDB.

Every query runs twice per rank count: with the default broadcast threshold and with broadcasts
disabled, so both broadcast and shuffle joins are exercised on the same data.
"""

from __future__ import annotations

import pytest

from support import assert_same, oracle, run_on_ranks

pytestmark = pytest.mark.dist

# (query, columns whose order the query fixes)
EDGE_QUERIES: list[tuple[str, list[str]]] = [
    ("SELECT i.k, i.v, b.w FROM t_int i JOIN t_big b ON i.k = b.k", []),
    ("SELECT i.k, i.v, b.d FROM t_int i JOIN t_big4 b ON b.k = i.k WHERE b.d > 10", []),
    ("SELECT a.k, a.x, b.y FROM na a JOIN nb b ON a.k = b.k", []),
    ("SELECT count(*) AS n, count(a.k) AS nk FROM na a JOIN nb b ON a.k = b.k", []),
    ("SELECT * FROM t_int JOIN empty_t ON t_int.k = empty_t.k", []),
    ("SELECT count(*), sum(k), min(z) FROM empty_t", []),
    ("SELECT o.label, b.k, b.w FROM one_row o JOIN t_big b ON o.k = b.k", []),
    (
        "SELECT s.k, count(*) AS c, sum(s.v) AS sv, sum(t.u) AS su FROM skew s JOIN skew2 t ON s.k = t.k GROUP BY s.k",
        [],
    ),
    ("SELECT sa.name, sa.v, sb.w FROM sa JOIN sb ON sa.name = sb.name", []),
    ("SELECT m1.a, m1.b, m1.v, m2.w FROM m1 JOIN m2 ON m1.a = m2.a AND m1.b = m2.b", []),
    (
        "SELECT i.v, b.w, sa.name FROM t_int i JOIN t_big b ON i.k = b.k JOIN sa ON sa.v = i.v WHERE i.v < 700",
        [],
    ),
    (
        "SELECT b.w, count(*) AS n, sum(i.v) AS s, min(i.v) AS lo, max(i.v) AS hi, avg(i.v) AS mean, "
        "count(DISTINCT i.k) AS dk FROM t_int i JOIN t_big b ON i.k = b.k GROUP BY b.w ORDER BY b.w",
        ["w"],
    ),
    (
        "SELECT i.k, i.v, b.w FROM t_int i JOIN t_big b ON i.k = b.k ORDER BY i.v DESC, i.k LIMIT 7",
        ["v", "k"],
    ),
    ("SELECT i.k, i.v FROM t_int i ORDER BY i.v LIMIT 5 OFFSET 3", ["v"]),
    ("SELECT count(*), sum(v), avg(v), min(v), max(v) FROM t_int WHERE v > 10", []),
    ("SELECT count(*) AS n FROM t_int i, t_big b WHERE i.k = b.k AND b.w <> 'w3'", []),
    ("SELECT k, v, w FROM t_int JOIN t_big USING (k) WHERE v % 5 = 1", []),
    (
        "SELECT i.k * 2 AS kk, upper(b.w) AS uw, i.v + 0.5 AS vv FROM t_int i JOIN t_big b ON i.k = b.k "
        "WHERE i.v % 3 = 0",
        [],
    ),
    ("SELECT DISTINCT b.w FROM t_int i JOIN t_big b ON i.k = b.k", []),
    ("SELECT count(DISTINCT w) AS dw FROM t_big", []),
    ("SELECT i.k % 5 AS g, sum(i.v) AS s FROM t_int i GROUP BY i.k % 5 ORDER BY g", ["g"]),
    (
        "SELECT b.w, count(*) AS n FROM t_int i JOIN t_big b ON i.k = b.k GROUP BY b.w HAVING count(*) > 250 "
        "ORDER BY 1",
        ["w"],
    ),
    (
        "SELECT p.k, p.price, p.day, b.d FROM prices p JOIN t_big4 b ON p.k = b.k ORDER BY p.day, p.k",
        ["day", "k"],
    ),
    (
        "SELECT p.day, sum(p.price) AS revenue FROM prices p GROUP BY p.day ORDER BY revenue DESC, p.day LIMIT 10",
        ["revenue", "day"],
    ),
    ("SELECT 1 + 2 AS three", []),
]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("threshold", ["default", "0"])
def test_edge_queries_match_duckdb(edge_dir, tmp_path, ranks, threshold):
    env = {} if threshold == "default" else {"DUCKFLOCK_BROADCAST_THRESHOLD_BYTES": threshold}
    queries = [q for q, _ in EDGE_QUERIES]
    results = run_on_ranks(edge_dir, ranks, queries, tmp_path, env)
    ref = oracle(edge_dir)
    for (query, order), got in zip(EDGE_QUERIES, results, strict=True):
        assert not isinstance(got, str), f"{query}\n{got}"
        try:
            assert_same(got, ref.sql(query).to_arrow_table(), order)
        except AssertionError as e:
            raise AssertionError(f"{query}: {e}") from None


SEED = (
    "SELECT c.c_custkey, c.c_name, o.o_orderkey, o.o_orderdate, o.o_totalprice "
    "FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
    "WHERE o.o_orderdate < DATE '1995-03-15' ORDER BY o.o_orderdate DESC"
)
TPCH_JOINS: list[tuple[str, list[str]]] = [
    (SEED, ["o_orderdate"]),
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
