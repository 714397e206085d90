"""Beyond inner joins: windows, set operations, outer/non-equi/cross joins, subqueries, CTEs,
non-decomposable aggregates — on real ranks, compared with single-process DuckDB."""

from __future__ import annotations

import pytest

from support import assert_same, oracle, run_on_ranks

pytestmark = pytest.mark.dist

QUERIES: list[tuple[str, list[str]]] = [
    (
        "SELECT k % 3 AS g, stddev_samp(v) AS sd, var_pop(v) AS vp, variance(v) AS vs, stddev_pop(v) AS sp, "
        "avg(v) AS a, count(*) AS n FROM t_int GROUP BY 1",
        [],
    ),
    ("SELECT stddev_samp(v) AS sd, var_samp(v) AS vs FROM t_int WHERE v = 7", []),
    ("SELECT a.k, stddev_samp(a.x) AS sd, var_samp(a.x) AS v FROM na a GROUP BY a.k", []),
    ("SELECT p.day, stddev_pop(p.price) AS sp FROM prices p GROUP BY p.day", []),
    (
        "SELECT w, count(DISTINCT k) AS dk, sum(DISTINCT k) AS sk, avg(DISTINCT k) AS ak FROM t_big GROUP BY w",
        [],
    ),
    ("SELECT i.k % 4 AS g, count(DISTINCT b.w) AS n FROM t_int i JOIN t_big b ON i.k = b.k GROUP BY 1", []),
    ("SELECT count(DISTINCT a.k) AS n FROM na a", []),
    ("SELECT k % 4 AS m, v % 3 AS r, sum(v) AS s FROM t_int GROUP BY ALL ORDER BY ALL", ["m", "r"]),
    ("SELECT DISTINCT w FROM t_big ORDER BY ALL DESC", ["w"]),
    (
        "SELECT k, v, row_number() OVER (PARTITION BY k ORDER BY v) AS rn, sum(v) OVER (PARTITION BY k) AS s "
        "FROM t_int",
        [],
    ),
    ("SELECT k, v, rank() OVER (ORDER BY v DESC) AS r FROM t_int", []),
    ("SELECT w, count(*) AS n, rank() OVER (ORDER BY count(*) DESC, w) AS r FROM t_big GROUP BY w", []),
    ("SELECT k, v, lag(v) OVER (PARTITION BY k % 10 ORDER BY v) AS prev FROM t_int", []),
    ("SELECT k FROM t_int UNION SELECT k FROM t_big", []),
    ("SELECT k FROM t_int UNION ALL SELECT k FROM t_big", []),
    ("SELECT k FROM t_int INTERSECT SELECT k FROM t_big", []),
    ("SELECT k FROM t_big EXCEPT SELECT k FROM t_int", []),
    ("SELECT k FROM t_big EXCEPT ALL SELECT k FROM t_int", []),
    ("SELECT k FROM t_int INTERSECT ALL SELECT k FROM t_int WHERE v < 1000", []),
    ("SELECT * FROM (SELECT k FROM t_int UNION SELECT k FROM t_big) u ORDER BY k DESC LIMIT 5", ["k"]),
    ("SELECT a.k, a.x, b.y FROM na a LEFT JOIN nb b ON a.k = b.k", []),
    ("SELECT a.k, a.x, b.y FROM na a RIGHT JOIN nb b ON a.k = b.k", []),
    ("SELECT a.k, a.x, b.y FROM na a FULL OUTER JOIN nb b ON a.k = b.k", []),
    ("SELECT a.x, b.y FROM na a FULL OUTER JOIN nb b ON a.k < b.k AND a.x > 490", []),
    ("SELECT a.x, b.y FROM na a JOIN nb b ON a.x BETWEEN b.y - 5 AND b.y + 5", []),
    ("SELECT a.x, b.u FROM na a CROSS JOIN skew2 b WHERE a.x < 20", []),
    ("SELECT a.x, b.y FROM na a JOIN nb b ON a.k = b.k AND a.x <> b.y - 3", []),
    ("SELECT a.x FROM na a WHERE a.k NOT IN (SELECT k FROM nb)", []),
    ("SELECT a.x FROM na a WHERE a.k NOT IN (SELECT k FROM nb WHERE k IS NOT NULL)", []),
    ("SELECT a.x FROM na a WHERE a.k IN (SELECT k FROM nb)", []),
    ("SELECT a.x FROM na a WHERE EXISTS (SELECT 1 FROM nb b WHERE b.k = a.k)", []),
    ("SELECT a.x FROM na a WHERE NOT EXISTS (SELECT 1 FROM nb b WHERE b.k = a.k)", []),
    ("SELECT a.x, (SELECT max(y) FROM nb) AS m FROM na a WHERE a.x > (SELECT avg(y) / 20 FROM nb)", []),
    ("SELECT i.k, i.v FROM t_int i WHERE i.v > (SELECT avg(v) FROM t_int j WHERE j.k = i.k)", []),
    (
        "WITH c AS (SELECT k, count(*) AS n FROM t_int GROUP BY k) "
        "SELECT c1.k, c1.n, c2.n AS n2 FROM c c1 JOIN c c2 ON c1.k = c2.k + 1",
        [],
    ),
    ("SELECT DISTINCT k % 7 AS m FROM t_int ORDER BY m", ["m"]),
    ("SELECT stddev_samp(v) AS sd, var_pop(v) AS vp, median(v) AS med FROM t_int", []),
    (
        "SELECT k % 3 AS g, stddev_samp(v) AS sd, string_agg(DISTINCT CAST(k % 2 AS VARCHAR), ',' "
        "ORDER BY CAST(k % 2 AS VARCHAR)) AS s FROM t_int GROUP BY 1",
        [],
    ),
    ("SELECT k, v FROM t_int ORDER BY v DESC, k", ["v", "k"]),
    ("SELECT a.k, a.x FROM na a ORDER BY a.k NULLS FIRST, a.x DESC", ["k", "x"]),
    ("SELECT a.k, a.x FROM na a ORDER BY a.k DESC, a.x", ["k", "x"]),
    ("SELECT name, v FROM sa ORDER BY name, v", ["name", "v"]),
    ("SELECT p.day, p.price, p.k FROM prices p ORDER BY p.day DESC, p.price, p.k", ["day", "price", "k"]),
    ("SELECT k, z FROM empty_t ORDER BY k", ["k"]),
    ("SELECT a.k, a.x FROM na a ORDER BY a.k DESC NULLS FIRST", ["k"]),
    ("SELECT a.k, a.x FROM na a ORDER BY a.k", ["k"]),
    ("SELECT p.day, p.k FROM prices p ORDER BY p.day DESC", ["day"]),
    ("SELECT p.price, p.k FROM prices p ORDER BY p.price", ["price"]),
    ("SELECT k, v FROM skew ORDER BY k, v", ["k", "v"]),
    (
        "SELECT CASE WHEN v > 100 THEN 'big' ELSE 'small' END AS c, count(*) AS n FROM t_int "
        "WHERE CAST(v AS VARCHAR) LIKE '1%' GROUP BY 1",
        [],
    ),
    (
        "SELECT p.day + INTERVAL 1 MONTH AS next_month, count(*) AS n FROM prices p "
        "WHERE p.day BETWEEN DATE '2020-03-01' AND DATE '2020-06-30' GROUP BY 1 ORDER BY 1",
        ["next_month"],
    ),
]


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("threshold", ["default", "0"])
def test_sql_coverage_matches_duckdb(edge_dir, tmp_path, ranks, threshold):
    # "0": no broadcasts, and every full ORDER BY is a parallel range-partitioned sort.
    env = (
        {}
        if threshold == "default"
        else {"DUCKFLOCK_BROADCAST_THRESHOLD_BYTES": "0", "DUCKFLOCK_RANGE_SORT_THRESHOLD_BYTES": "0"}
    )
    results = run_on_ranks(edge_dir, ranks, [q for q, _ in QUERIES], tmp_path, env)
    ref = oracle(edge_dir)
    failures = []
    for (query, order), got in zip(QUERIES, results, strict=True):
        if isinstance(got, str):
            failures.append(f"{query}: {got}")
            continue
        try:
            assert_same(got, ref.sql(query).to_arrow_table(), order)
        except AssertionError as e:
            failures.append(f"{query}: {str(e)[:300]}")
    assert not failures, "\n".join(failures)
