"""Which calls are aggregates, decided by DuckDB's own function catalog.

sqlglot types only the aggregates it knows (SUM, COUNT, ...); DuckDB has dozens more (product, mad,
entropy, histogram, ...) that sqlglot parses as plain function calls. Treating one of those as a
scalar would let every rank answer with its own rows: a wrong answer. So the binder asks DuckDB, by
the name DuckDB will see, and counts a macro as an aggregate when its body calls one (geomean).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Container
from typing import NamedTuple

import duckdb
import sqlglot
from sqlglot import exp

from duckflock.sql.scopes import in_subquery

# Wrappers that belong to the aggregate call they hold: SUM(x) FILTER (WHERE ...), LAG(x IGNORE NULLS),
# QUANTILE_CONT(0.5) WITHIN GROUP (ORDER BY x). The outermost wrapper is the aggregate's unit.
WRAPPERS = (exp.Filter, exp.IgnoreNulls, exp.RespectNulls, exp.WithinGroup)

_NAME = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(")


class FunctionRow(NamedTuple):
    name: str
    kind: str  # scalar, aggregate, macro, table, ...
    alias_of: str | None
    stability: str  # CONSISTENT, VOLATILE, ...
    macro_body: str | None


def function_rows(con: duckdb.DuckDBPyConnection) -> list[FunctionRow]:
    """DuckDB's function catalog, read in one query (each query adds to the planner's start-up)."""
    rows = con.execute(
        "SELECT DISTINCT function_name, function_type, alias_of, stability, macro_definition "
        "FROM duckdb_functions()"
    ).fetchall()
    return [FunctionRow(*r) for r in rows]


class AggregateNames:
    """``name in names``: is DuckDB's function of this lower-case name an aggregate, or a macro whose
    body calls one (also through other macros)? Parsing every macro body takes a fifth of a second,
    so it is done on the first question about a macro, not for every query's start."""

    def __init__(self, functions: list[FunctionRow]):
        """``functions``: DuckDB's catalog, as ``function_rows`` reads it."""
        self._aggregates = frozenset(f.name.lower() for f in functions if f.kind == "aggregate")
        self._macros: dict[str, list[str]] = {}
        for f in functions:
            if f.kind == "macro" and f.macro_body:
                self._macros.setdefault(f.name.lower(), []).append(f.macro_body)
        self._with_macros: frozenset[str] | None = None
        self._lock = threading.Lock()  # a worker's driver may plan two queries at once

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if name in self._aggregates:
            return True
        return name in self._macros and name in self._aggregating_macros()

    def _aggregating_macros(self) -> frozenset[str]:
        with self._lock:
            if self._with_macros is None:
                names = set(self._aggregates)
                changed = True
                while changed:  # a macro may call a macro that aggregates
                    changed = False
                    for name, bodies in self._macros.items():
                        if name not in names and any(_calls_any(body, names) for body in bodies):
                            names.add(name)
                            changed = True
                self._with_macros = frozenset(names)
            return self._with_macros


def _calls_any(body: str, names: Container[str]) -> bool:
    try:
        tree = sqlglot.parse_one(body, read="duckdb")
    except sqlglot.errors.SqlglotError:
        return False
    return any(function_name(f) in names for f in tree.find_all(exp.Func))


def function_name(node: exp.Expr) -> str | None:
    """The name DuckDB sees for a function call node (sqlglot renames some: LIST -> ARRAY_AGG)."""
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    if not isinstance(node, exp.Func) or isinstance(node, exp.Cast | exp.Case | exp.If):
        return None
    text = node.sql(dialect="duckdb")
    m = _NAME.match(text)
    # Operators that sqlglot models as functions (AND, OR, COLLATE, ->, @>) print as their left
    # operand first: ``sum(x) > 1 OR a`` starts with a call that is not this node's.
    return m.group(1).lower() if m and _closes_at_end(text, m.end()) else None


def _closes_at_end(text: str, open_at: int) -> bool:
    """Whether the parenthesis opened just before ``open_at`` closes at the end of ``text``
    (quoted strings and identifiers skipped)."""
    depth, i, quote = 1, open_at, ""
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = ""  # a doubled quote reopens at once: escapes need no special case
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return text[i + 1 :].strip() == ""
        i += 1
    return False


def unit_of(call: exp.Expr) -> exp.Expr:
    """The aggregate call together with its FILTER / IGNORE NULLS / WITHIN GROUP wrappers."""
    unit = call
    while isinstance(unit.parent, WRAPPERS) and unit.parent.this is unit:
        unit = unit.parent
    return unit


def call_of(unit: exp.Expr) -> exp.Expr:
    """The aggregate call inside a unit (the inverse of ``unit_of``)."""
    while isinstance(unit, WRAPPERS):
        unit = unit.this
    return unit


class Aggregates:
    """Finds aggregate calls in expressions, by DuckDB's catalog of aggregate names."""

    def __init__(self, names: AggregateNames):
        self.names = names

    def is_call(self, node: exp.Expr) -> bool:
        return function_name(node) in self.names

    def units(self, e: exp.Expr) -> list[exp.Expr]:
        """Grouping aggregates in ``e`` (not window functions), outermost units, not nested in a
        subquery (those belong to the subquery's own scope)."""
        out: list[exp.Expr] = []
        for node in e.find_all(exp.Func):
            if not self.is_call(node) or in_subquery(node, e):
                continue
            unit = unit_of(node)
            if isinstance(unit.parent, exp.Window) and unit.parent.this is unit:
                continue
            if not any(unit is u for u in out):
                out.append(unit)
        # An aggregate nested in another's argument is the binder's error; DuckDB reported it.
        return [u for u in out if not any(u is not o and _inside(u, o) for o in out)]


def _inside(node: exp.Expr, outer: exp.Expr) -> bool:
    p = node.parent
    while p is not None:
        if p is outer:
            return True
        p = p.parent
    return False
