"""sqlglot's ``pushdown_predicates`` without the simplification it runs first, and leaving WHERE
conditions with a subquery where they are written.

Before moving a WHERE or ON condition, sqlglot's rule simplifies it with sqlglot's own idea of
types, not DuckDB's: ``x < '10' AND x < '9'`` became ``x < '10'`` (literals compared as text,
where DuckDB casts them to the INTEGER column's type), ``DATE '2020-01-31' + INTERVAL 5 HOUR`` a
DATE, ``f + 0.1 > 0.3`` the exact ``f > 0.2``, ``DATE '2020-01-01' = TIMESTAMP '2020-01-01'``
FALSE, and ``x > 2147483647 + 1`` lost its overflow error: wrong answers. Predicates are moved as
written here. sqlglot offers no switch for it, so its module's ``simplify`` is swapped for the
identity during the call, under a lock (concurrent planners share the module).

A WHERE condition holding a subquery stays in the WHERE: moved into a join's ON (TPC-H Q15's
``total_revenue = (SELECT max(...))`` over ``supplier, revenue``), the planner, which evaluates
subqueries only in filters and projections, refused the query on any data too large for the
driver.
"""

from __future__ import annotations

import threading

import sqlglot.optimizer.pushdown_predicates as _rule
from sqlglot import exp

from duckflock.sql.scopes import conjuncts

_LOCK = threading.Lock()


def pushdown_predicates(expression: exp.Expr, dialect: str | None = None) -> exp.Expr:
    held = _hold_subquery_conditions(expression)
    with _LOCK:
        simplify = _rule.simplify
        _rule.simplify = lambda condition, **_: condition
        try:
            expression = _rule.pushdown_predicates(expression, dialect=dialect)
            # The subqueries of the conditions held out get their own predicates pushed down.
            for _, conditions in held:
                for select in _outermost_selects(conditions):
                    _rule.pushdown_predicates(select, dialect=dialect)
        finally:
            _rule.simplify = simplify
    for select, conditions in held:
        select.where(*conditions, copy=False)
    return expression


def _outermost_selects(conditions: list[exp.Expr]) -> list[exp.Select]:
    """The SELECTs of ``conditions`` not inside another SELECT of them."""
    return [
        s
        for c in conditions
        for s in c.find_all(exp.Select)
        if not any(isinstance(a, exp.Select) for a in _ancestors(s, c))
    ]


def _ancestors(node: exp.Expr, top: exp.Expr) -> list[exp.Expr]:
    """The nodes between ``node`` (excluded) and ``top`` (included)."""
    found = []
    parent = node.parent
    while parent is not None and node is not top:
        found.append(parent)
        if parent is top:
            break
        node, parent = parent, parent.parent
    return found


def _hold_subquery_conditions(expression: exp.Expr) -> list[tuple[exp.Select, list[exp.Expr]]]:
    """Take the conditions holding a subquery out of every WHERE, for putting back afterwards."""
    held = []
    for select in list(expression.find_all(exp.Select)):
        where = select.args.get("where")
        if where is None:
            continue
        parts = conjuncts(where.this)
        taken = [c for c in parts if c.find(exp.Select) is not None]
        if not taken:
            continue
        kept = [c for c in parts if c.find(exp.Select) is None]
        select.set("where", exp.Where(this=exp.and_(*kept, copy=False)) if kept else None)
        held.append((select, taken))
    return held
