"""Which sqlglot rules a query skips: normalize only where an OR over ANDs computes something that
may raise (its conjunctive form would evaluate it on rows DuckDB never does), not for plain
comparisons, whose conjunctive form the planner needs to find join keys inside an OR."""

from __future__ import annotations

import pytest
import sqlglot

from duckflock.sql.rewrite_hazards import rules_to_skip


@pytest.mark.parametrize(
    ("where", "skips"),
    [
        ("(a = 1 AND b LIKE 'x%' AND c BETWEEN 1 AND 5 AND d IN ('a', 'b')) OR (a = 2 AND e IS NULL)", False),
        ("(a = b AND c > 1 + 10) OR (a = b AND lower(e) = 'x')", False),
        ("(b <> 0 AND a % b = 0) OR g = 1", True),
        ("(b <> 1 AND 10 // (a - 1) > 2) OR g = 1", True),
        ("(s SIMILAR TO '[0-9]+' AND CAST(s AS INTEGER) > 5) OR g = 1", True),
        ("(s SIMILAR TO '[0-9]+' AND TRY_CAST(s AS INTEGER) > 5) OR g = 1", False),
    ],
)
def test_normalize_is_skipped_only_for_computations_that_may_raise(where, skips):
    tree = sqlglot.parse_one(f"SELECT * FROM t WHERE {where}", read="duckdb")
    assert ("normalize" in rules_to_skip(tree, frozenset(), lambda sql: [])) is skips
