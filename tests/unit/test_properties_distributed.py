"""Property tests: random tables (NULLs, duplicates, skew, mixed key types, empty partitions) and
random join / aggregate / window / set queries give single-process DuckDB's answer on 1-4 ranks.

Ranks run as threads over the in-process transport (same planner, stages and exchanges as MPI), so
hypothesis can try many cases quickly; the MPI transport is covered by the tests in tests/distributed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import duckflock
from support import assert_same, make_table, oracle

keys = st.one_of(st.none(), st.integers(-3, 12))  # small domain: many duplicates and matches
rows_a = st.lists(st.tuples(keys, st.integers(0, 4), st.integers(-1000, 1000)), max_size=60)
rows_b = st.lists(st.tuples(keys, st.sampled_from(["x", "y", "zz", "", "ü"])), max_size=40)
skewed = st.lists(st.tuples(st.just(7), st.integers(0, 4), st.integers(-5, 5)), max_size=80)

JOINS = ["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"]
AGGS = [
    "count(*)",
    "sum(a.v)",
    "min(b.w)",
    "max(a.v)",
    "avg(a.v)",
    "count(DISTINCT b.w)",
    "count(b.k)",
    # Beyond the allow-list: these must move raw rows, never be answered per rank.
    "product(a.g)",
    "mad(a.v)",
    "median(a.v)",
    "mean(a.v)",
    "entropy(a.g)",
    "bool_and(a.v > 0)",
    "bit_xor(a.v)",
    "count_if(a.v > 0)",
    "string_agg(b.w, ',' ORDER BY b.w, a.v)",
    "sum(a.v) FILTER (WHERE a.g > 1)",
    "histogram(a.g)",
    "list(DISTINCT a.g ORDER BY a.g)",
]
# (query template, output columns whose sequence the query's ORDER BY fixes)
TEMPLATES = [
    ("SELECT a.k, a.g, a.v, b.w FROM a {join} b ON a.k = b.k", None),
    ("SELECT a.g, {agg} AS m FROM a {join} b ON a.k = b.k GROUP BY a.g", None),
    ("SELECT b.w, {agg} AS m FROM a {join} b ON a.k = b.k GROUP BY b.w", None),
    ("SELECT {agg} AS m FROM a {join} b ON a.k = b.k", None),
    ("SELECT a.k, a.v, row_number() OVER (PARTITION BY a.g ORDER BY a.v, a.k) AS rn FROM a", None),
    ("SELECT a.g, sum(a.v) OVER (PARTITION BY a.g) AS s, a.v FROM a", None),
    ("SELECT k FROM a UNION SELECT k FROM b", None),
    ("SELECT k FROM a EXCEPT SELECT k FROM b", None),
    ("SELECT a.k, a.v FROM a WHERE a.k NOT IN (SELECT k FROM b)", None),
    ("SELECT a.k, a.v FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k)", None),
    ("SELECT DISTINCT a.g, b.w FROM a {join} b ON a.k = b.k", None),
    ("SELECT a.k, a.v FROM a ORDER BY a.v DESC, a.k NULLS FIRST LIMIT 7", ["v", "k"]),
    ("SELECT a.k, a.g, a.v FROM a ORDER BY a.g, a.v, a.k", ["g", "v", "k"]),
    # Subqueries with NULLs and empty sets on either side (three-valued IN / ANY / ALL).
    ("SELECT a.k, a.v, a.k IN (SELECT k FROM b) AS r FROM a", None),
    ("SELECT a.k, a.k NOT IN (SELECT k FROM b WHERE b.w <> 'x') AS r FROM a", None),
    ("SELECT a.k, a.v > ALL (SELECT k FROM b) AS r, a.k = ANY (SELECT k FROM b) AS s FROM a", None),
    ("SELECT a.k, (SELECT count(*) FROM b WHERE b.k = a.k) AS n FROM a", None),
    ("SELECT a.k, (SELECT min(b.w) || count(*) FROM b WHERE b.k = a.g) AS m FROM a", None),
    ("SELECT a.k, a.v FROM a WHERE a.v > (SELECT avg(v) FROM a a2 WHERE a2.g = a.g)", None),
    ("SELECT a.k FROM a WHERE a.k > ANY (SELECT b.k FROM b WHERE b.k <> a.g)", None),
    ("SELECT a.g, {agg} AS m FROM a {join} b ON a.k = b.k GROUP BY a.g HAVING count(*) > 1", None),
]


def values(rows: list[tuple], cols: list[tuple[str, str]]) -> str:
    if not rows:
        return "SELECT " + ", ".join(f"CAST(NULL AS {t}) AS {c}" for c, t in cols) + " WHERE false"

    def lit(v: object) -> str:
        return "NULL" if v is None else (f"'{v}'" if isinstance(v, str) else str(v))

    body = ", ".join("(" + ", ".join(lit(v) for v in r) + ")" for r in rows)
    casts = ", ".join(f"CAST(col{i} AS {t}) AS {c}" for i, (c, t) in enumerate(cols))
    return f"SELECT {casts} FROM (VALUES {body}) t({', '.join(f'col{i}' for i in range(len(cols)))})"


# The thorough profile (DUCKFLOCK_HYPOTHESIS=thorough) runs for many minutes: no per-test timeout then.
@pytest.mark.timeout(0 if os.environ.get("DUCKFLOCK_HYPOTHESIS") == "thorough" else 300)
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(
    a=st.one_of(rows_a, skewed),
    b=rows_b,
    parts_a=st.integers(1, 5),
    parts_b=st.integers(1, 4),
    hashed=st.booleans(),
    ranks=st.integers(1, 4),
    broadcast=st.booleans(),
    template=st.sampled_from(TEMPLATES),
    join=st.sampled_from(JOINS),
    agg=st.sampled_from(AGGS),
)
def test_random_queries_match_duckdb(a, b, parts_a, parts_b, hashed, ranks, broadcast, template, join, agg):
    root = Path(tempfile.mkdtemp(prefix="duckflock-prop-"))
    try:
        kind, key = ("hash", ("k",)) if hashed else ("none", ())
        make_table(
            root, "a", values(a, [("k", "INTEGER"), ("g", "INTEGER"), ("v", "INTEGER")]), parts_a, kind, key
        )
        make_table(root, "b", values(b, [("k", "BIGINT"), ("w", "VARCHAR")]), parts_b, kind, key)
        query = template[0].format(join=join, agg=agg)
        config = {"broadcast_threshold_bytes": 16 << 20 if broadcast else 0, "range_sort_threshold_bytes": 0}
        with duckflock.connect(str(root), ranks=ranks, transport="threads", config=config) as db:
            got = db.sql(query).arrow()
        want = oracle(root).sql(query).to_arrow_table()
        assert_same(got, want, template[1])
    finally:
        shutil.rmtree(root, ignore_errors=True)
