"""ORDER BY ALL inside a query, written out as the output columns it sorts by.

sqlglot's ``pushdown_projections`` drops the columns of a derived table, CTE or subquery that the
outer query does not read, and sees ALL as an opaque word: ``(SELECT * FROM t ORDER BY ALL LIMIT 3)``
would then sort by fewer columns and keep other rows. Written out as the output names, the columns
are kept (a bare name in ORDER BY is an output column, to sqlglot as to DuckDB). The outermost
query keeps its ALL: nothing prunes its columns, and the planner expands it (sql/builder.py).
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.optimizer.scope import traverse_scope

from duckflock.sql.allowlist import unsupported


def order_by_all_written_out(expression: exp.Expr, **_: object) -> exp.Expr:
    """After qualify (stars expanded, every output named)."""
    for scope in traverse_scope(expression):
        query = scope.expression
        if query is expression or not isinstance(query, exp.Query):
            continue
        order = query.args.get("order")
        if order is None or not _is_all(order):
            continue
        names = [s.alias_or_name for s in query.selects] if isinstance(query, exp.Select) else []
        if not names or len({n.lower() for n in names}) != len(names):
            raise unsupported("ORDER BY ALL inside a query, over a set operation or repeated names")
        template = order.expressions[0]
        keys = []
        for name in names:
            key = template.copy()
            key.set("this", exp.column(name, quoted=True))
            keys.append(key)
        order.set("expressions", keys)
    return expression


def _is_all(order: exp.Order) -> bool:
    keys = order.expressions
    return len(keys) == 1 and isinstance(keys[0].this, exp.Var) and keys[0].name.upper() == "ALL"
