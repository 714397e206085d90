"""Rewrites of what sqlglot's rules and the builder would misread, each keeping DuckDB's meaning
(passes of sql/passes.py)."""

from __future__ import annotations

from sqlglot import exp

from duckflock.sql.functions import Aggregates
from duckflock.sql.scopes import query_of


def aggregate_calls_marked(tree: exp.Expr, aggregates: Aggregates) -> exp.Expr:
    """DuckDB aggregates sqlglot does not know become aggregate nodes, so that no rule moves them
    as if they were scalar functions."""
    for call in list(tree.find_all(exp.Anonymous)):
        if aggregates.is_call(call):
            call.replace(exp.AnonymousAggFunc(this=call.this, expressions=call.expressions))
    return tree


def named_windows_written_out(tree: exp.Expr) -> exp.Expr:
    """``OVER w ... WINDOW w AS (...)``: each definition copied into the windows that name it."""
    for select in list(tree.find_all(exp.Select)):
        _expand_named_windows(select)
    return tree


def order_by_star_as_all(tree: exp.Expr) -> exp.Expr:
    """ORDER BY * is ORDER BY ALL."""
    for ordered in list(tree.find_all(exp.Ordered)):
        if isinstance(ordered.this, exp.Star):
            ordered.set("this", exp.var("ALL"))
    return tree


def any_all_subqueries(tree: exp.Expr) -> exp.Expr:
    """``x = ANY (SELECT ...)``: the query under ANY / ALL in a Subquery node, as elsewhere."""
    for node in list(tree.find_all(exp.Any, exp.All)):
        if isinstance(node.this, exp.Query):
            node.set("this", exp.Subquery(this=node.this))
    return tree


def _expand_named_windows(select: exp.Select) -> None:
    """``OVER w ... WINDOW w AS (...)``: copy each definition into the windows that name it."""
    defs: dict[str, exp.Window] = {}
    for w in select.args.get("windows") or []:
        _inherit(w, defs)
        defs[w.name.lower()] = w
    select.set("windows", None)
    for w in select.find_all(exp.Window):
        if query_of(w) is select:
            _inherit(w, defs)


def _inherit(w: exp.Window, defs: dict[str, exp.Window]) -> None:
    alias = w.args.get("alias")
    if alias is None or alias.name.lower() not in defs:
        return
    base = defs[alias.name.lower()]
    for arg in ("partition_by", "order", "spec"):
        if base.args.get(arg) and not w.args.get(arg):
            value = base.args[arg]
            w.set(arg, [v.copy() for v in value] if isinstance(value, list) else value.copy())
    w.set("alias", None)
