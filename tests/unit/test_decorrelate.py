"""A decorrelated subquery's aggregate reads only the keys outer rows can have (sql/decorrelate.py);
results are checked against DuckDB in tests/sql/subqueries.test and the TPC-H tests."""

from __future__ import annotations

import sqlglot
from sqlglot.optimizer.qualify import qualify

from duckflock.sql.decorrelate import scalar_subqueries_to_joins

SCHEMA = {"t1": {"a": "INTEGER", "g": "INTEGER"}, "t3": {"c": "INTEGER", "s": "VARCHAR"}}


def rewritten(sql: str) -> str:
    tree = qualify(sqlglot.parse_one(sql, read="duckdb"), schema=SCHEMA, dialect="duckdb")
    return scalar_subqueries_to_joins(tree, SCHEMA).sql("duckdb")


def test_the_outer_items_own_filters_restrict_the_aggregated_keys():
    sql = rewritten(
        "SELECT a FROM t1 WHERE g = 2 AND a + 1 > g AND a >= (SELECT avg(c) FROM t3 WHERE t3.c = t1.a)"
    )
    magic = 'JOIN (SELECT DISTINCT "t1"."a" AS "_m0" FROM "t1" AS "t1" WHERE "t1"."g" = 2 AND "t1"."a" + 1 > "t1"."g")'
    assert magic in sql
    assert 'ON "t3"."c" = "_sq1_m"."_m0" GROUP BY "t3"."c"' in sql


def test_no_restriction_without_a_filter_of_the_outer_item_alone():
    for sql in (
        "SELECT a FROM t1 WHERE a >= (SELECT avg(c) FROM t3 WHERE t3.c = t1.a)",
        # other items' columns, a volatile function: not the item's own filter
        "SELECT a FROM t1, t3 x WHERE t1.a = x.c AND a >= (SELECT avg(c) FROM t3 WHERE t3.c = t1.a)",
        "SELECT a FROM t1 WHERE random() < 2 AND a >= (SELECT avg(c) FROM t3 WHERE t3.c = t1.a)",
    ):
        out = rewritten(sql)
        assert "_sq1" in out and "_sq1_m" not in out, out
