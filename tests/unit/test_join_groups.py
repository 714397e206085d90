"""Parenthesized joins undone or made derived tables (sql/join_groups.py): for any nesting of inner,
cross, comma, outer and semi joins, the rewrite is refused by name or DuckDB gives the same rows for
it as for the query."""

from __future__ import annotations

import duckdb
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.qualify import qualify

from duckflock.catalog import Catalog
from duckflock.errors import NotDistributed
from duckflock.sql.join_groups import flatten_join_groups, groups_as_derived_tables
from duckflock.sql.schema_db import SchemaDB
from duckflock.testing.tables import make_table, oracle

TABLES = {
    "a": "SELECT CASE WHEN i % 5 = 0 THEN NULL ELSE i % 3 END AS k, i AS v FROM range(7) t(i)",
    "b": "SELECT i % 2 AS k, i AS w FROM range(5) t(i)",
    "c": "SELECT i % 3 AS k, i AS u FROM range(4) t(i)",
    "d": "SELECT i % 2 AS k2, i AS x FROM range(3) t(i)",
}
JOINS = ["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN", "CROSS JOIN", ",", "SEMI JOIN"]


def _join(left: str, right: str, how: str, key: str) -> str:
    if how in ("CROSS JOIN", ","):
        return f"{left} {how} {right}" if how != "," else f"{left}, {right}"
    return f"{left} {how} {right} ON {key}"


@st.composite
def queries(draw) -> str:
    """FROM of a, b, c, d (each once) joined with parentheses around two of them, first or not."""
    first, second, third = draw(st.permutations(["a", "b", "c"]))
    hows = [draw(st.sampled_from(JOINS)) for _ in range(3)]
    group = _join(second, third, hows[0], f"{second}.k = {third}.k")
    if draw(st.booleans()):  # the group first
        body = _join(f"({group})", first, hows[1], f"{first}.k = {second}.k")
    else:
        body = _join(first, f"({group})", hows[1], f"{first}.k = {third}.k")
    body = _join(body, "d", hows[2], f"d.k2 = {first}.k")
    return f"SELECT * FROM {body}"


def test_flattened_joins_give_duckdbs_rows(tmp_path) -> None:
    for name, sql in TABLES.items():
        make_table(tmp_path, name, sql)
    catalog = Catalog.load(tmp_path)
    schema_db = SchemaDB(catalog)
    schema = {n: dict(info.columns) for n, info in catalog.tables.items()}
    con = oracle(tmp_path)

    @settings(max_examples=150, deadline=None)
    @given(queries())
    def check(sql: str) -> None:
        try:
            want = sorted(map(repr, con.sql(sql).fetchall()))
        except duckdb.Error:  # DuckDB rejects it (a comma before a RIGHT JOIN, ...)
            return
        try:
            tree = flatten_join_groups(sqlglot.parse_one(sql, read="duckdb"), schema_db)
            tree = groups_as_derived_tables(qualify(tree, schema=schema, dialect="duckdb"))
        except (NotDistributed, SqlglotError):  # the planner refuses both
            return
        assert sorted(map(repr, con.sql(tree.sql(dialect="duckdb")).fetchall())) == want, sql

    try:
        check()
    finally:
        schema_db.close()
