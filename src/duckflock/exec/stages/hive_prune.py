"""Skipping the files of a hive-partitioned table whose ``key=value`` directories cannot match a
scan's filter, before any rank opens them (for objects, before any request).

Only the filter's top-level ``AND`` terms that read hive columns alone, and only comparisons,
``IN``, ``BETWEEN`` and ``IS [NOT] NULL`` of a column with constants, are used: DuckDB evaluates
them over each file's values, cast to the hive types as DuckDB reads them, and a file is kept
unless some term is not true there (each term holds for every row of a file alike). Anything else
keeps every file: pruning only saves reads, the stage's query still applies the whole filter.
"""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Sequence

import duckdb
import sqlglot
from sqlglot import exp

from duckflock.plan.nodes import Filter, Node, Scan, walk
from duckflock.sqltext import quote_ident as q
from duckflock.sqltext import sql_literal

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"  # what DuckDB (and Hive, Spark) write for a NULL value
_SIMPLE = (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE, exp.In, exp.Between, exp.Is, exp.Not)
_CONSTANTS = (exp.Literal, exp.Cast, exp.Null, exp.Boolean, exp.Neg, exp.Tuple, exp.DataType, exp.Paren)


def scan_filters(root: Node) -> dict[int, str]:
    """The conditions that apply to a Scan's rows alone (a Filter right above it, and the Scan's
    own), by the Scan's id, over its source columns."""
    found: dict[int, str] = {}
    for node in walk(root):
        if isinstance(node, Scan) and node.filter:
            found[id(node)] = node.filter
        if not isinstance(node, Filter) or node.subqueries or node.correlated:
            continue
        child = node.child
        if isinstance(child, Scan) and node.condition:
            renames = tuple(zip(child.columns, child.source_columns, strict=True))
            found[id(child)] = _renamed(node.condition, renames) or found.get(id(child), "")
    return {k: v for k, v in found.items() if v}


@functools.lru_cache(maxsize=256)
def _renamed(condition: str, renames: tuple[tuple[str, str], ...]) -> str | None:
    """``condition`` over a Scan's output columns, rewritten over its source columns."""
    names = {out.lower(): src for out, src in renames}
    try:
        tree = sqlglot.parse_one(condition, read="duckdb")
    except sqlglot.errors.ParseError:
        return None
    for column in list(tree.find_all(exp.Column)):
        src = names.get(column.name.lower())
        if src is None:
            return None
        column.replace(exp.column(src, quoted=True))
    return tree.sql(dialect="duckdb")


def prune(files: Sequence[str], hive: Sequence[tuple[str, str]], filter_sql: str | None) -> list[str]:
    """The ``files`` whose hive values may satisfy ``filter_sql`` (all of them when unsure)."""
    if not files or not hive or not filter_sql:
        return list(files)
    terms = _hive_terms(filter_sql, frozenset(n.lower() for n, _ in hive))
    if not terms:
        return list(files)
    keep = _matching(tuple(files), tuple(hive), terms)
    return [f for i, f in enumerate(files) if i in keep]


@functools.lru_cache(maxsize=256)
def _hive_terms(filter_sql: str, names: frozenset[str]) -> str | None:
    try:
        tree = sqlglot.parse_one(filter_sql, read="duckdb")
    except sqlglot.errors.ParseError:
        return None
    terms = [t for t in tree.flatten() if _usable(t, names)] if isinstance(tree, exp.And) else []
    if not isinstance(tree, exp.And) and _usable(tree, names):
        terms = [tree]
    return " AND ".join(f"({t.sql(dialect='duckdb')})" for t in terms) or None


def _usable(term: exp.Expr, names: frozenset[str]) -> bool:
    if not isinstance(term, _SIMPLE):
        return False
    columns = list(term.find_all(exp.Column))
    if not columns or any(c.name.lower() not in names or c.table for c in columns):
        return False
    # Nothing but the columns, constants and the comparison itself: no function, no subquery.
    allowed = (*_SIMPLE, exp.Column, exp.Identifier, *_CONSTANTS)
    return all(isinstance(n, allowed) for n in term.walk())


def _values(path: str, names: Sequence[str]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for segment in path.split("/")[:-1]:
        key, eq, value = segment.partition("=")
        if eq and key in names:
            value = urllib.parse.unquote(value)
            found[key] = None if value == HIVE_NULL else value
    return found


@functools.lru_cache(maxsize=64)
def _matching(files: tuple[str, ...], hive: tuple[tuple[str, str], ...], terms: str) -> set[int]:
    names = [n for n, _ in hive]
    rows = []
    for i, f in enumerate(files):
        values = _values(f, names)
        if set(values) != set(names):
            return set(range(len(files)))  # a file without the directories: unsure, keep all
        cells = [f"TRY_CAST({sql_literal(values[n])} AS {t})" for n, t in hive]
        rows.append(f"({i}, {', '.join(cells)})")
    columns = ", ".join(["__file", *(q(n) for n in names)])
    sql = f"SELECT __file FROM (VALUES {', '.join(rows)}) AS t({columns}) WHERE {terms}"
    try:
        with duckdb.connect() as con:
            return {r[0] for r in con.execute(sql).fetchall()}
    except duckdb.Error:
        return set(range(len(files)))
