"""DISTINCT ON as a window the planner already distributes.

``SELECT DISTINCT ON (k) ... ORDER BY o`` keeps, per distinct ``k``, the first row by ``o``. That is
``QUALIFY row_number() OVER (PARTITION BY k ORDER BY o) = 1``: a window partitioned by ``k``, which
runs where each ``k`` is whole (hash by ``k``), keeping the query's own ORDER BY for the output.
Which row wins among rows that tie on ``o`` is arbitrary in DuckDB too.
"""

from __future__ import annotations

from sqlglot import exp

from duckflock.sql.allowlist import unsupported


def distinct_on_as_qualify(tree: exp.Expr) -> exp.Expr:
    for select in list(tree.find_all(exp.Select)):
        distinct = select.args.get("distinct")
        if distinct is not None and distinct.args.get("on") is not None:
            _rewrite(select, distinct)
    return tree


def _rewrite(select: exp.Select, distinct: exp.Distinct) -> None:
    if select.args.get("qualify") is not None:
        raise unsupported("DISTINCT ON with QUALIFY")  # DISTINCT ON applies after QUALIFY
    on = distinct.args["on"]
    keys = on.expressions if isinstance(on, exp.Tuple) else [on]
    order = select.args.get("order")
    partition = [_resolved(k, select) for k in keys]
    ordered = [_ordered(o, select) for o in order.expressions] if order else []
    if any(e.find(exp.Window) for e in [*partition, *ordered]):  # a window cannot hold another
        raise unsupported("DISTINCT ON keyed or ordered by a window function")
    window = exp.Window(
        this=exp.RowNumber(),
        partition_by=partition,
        order=exp.Order(expressions=ordered) if order else None,
    )
    select.set("distinct", None)
    select.set("qualify", exp.Qualify(this=exp.EQ(this=window, expression=exp.Literal.number(1))))


def _ordered(o: exp.Ordered, select: exp.Select) -> exp.Ordered:
    copy = o.copy()
    copy.set("this", _resolved(o.this, select))
    return copy


def _resolved(e: exp.Expr, select: exp.Select) -> exp.Expr:
    """A DISTINCT ON or ORDER BY item as an expression over the FROM clause: like ORDER BY, it may
    name an output column by position or alias, which a window cannot."""
    items = select.expressions
    if isinstance(e, exp.Literal) and not e.is_string:
        i = int(e.this) - 1
        if any(isinstance(x, exp.Star) for x in items) or not 0 <= i < len(items):
            raise unsupported("DISTINCT ON with a positional key over *")
        return _unaliased(items[i]).copy()
    if isinstance(e, exp.Column) and not e.table:
        for item in items:
            if isinstance(item, exp.Alias) and item.alias.lower() == e.name.lower():
                return item.this.copy()
    if isinstance(e, exp.Var | exp.Star) or (
        isinstance(e, exp.Column) and e.name.upper() == "ALL" and not e.table
    ):
        raise unsupported("DISTINCT ON with ORDER BY ALL")
    return e.copy()


def _unaliased(e: exp.Expr) -> exp.Expr:
    return e.this if isinstance(e, exp.Alias) else e
