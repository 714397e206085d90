"""Small questions about a query's scopes, shared by the binder and its rewrite rules."""

from __future__ import annotations

from sqlglot import exp


def conjuncts(e: exp.Expr) -> list[exp.Expr]:
    """Split an AND tree, through parentheses."""
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.And):
        return conjuncts(e.this) + conjuncts(e.expression)
    return [e]


def in_subquery(node: exp.Expr, root: exp.Expr) -> bool:
    """Whether ``node`` is inside a query within ``root`` (a subquery of an expression)."""
    p = node.parent
    while p is not None and p is not root:
        if isinstance(p, exp.Query):
            return True
        p = p.parent
    return False


def query_of(node: exp.Expr) -> exp.Expr | None:
    """The innermost query (SELECT or set operation) ``node`` is part of."""
    p = node.parent
    while p is not None and not isinstance(p, exp.Query):
        p = p.parent
    return p


def from_items(select: exp.Select) -> dict[str, exp.Expr]:
    """Alias -> FROM item of a SELECT's own FROM and JOINs."""
    from_ = select.args.get("from_") or select.args.get("from")
    items = ([from_.this] if from_ is not None else []) + [j.this for j in select.args.get("joins") or []]
    return {i.alias_or_name: i for i in items}


def outer_columns(body: exp.Expr, within: exp.Expr | None = None) -> list[exp.Column]:
    """Columns of ``body`` (or of its part ``within``) that belong to a query enclosing ``body``: a
    correlated subquery has some. A name is looked up as SQL scopes it, from the column's own
    query outwards, so a FROM item deeper inside the body does not hide an outer one."""
    return [c for c in (within or body).find_all(exp.Column) if c.table and not _bound_inside(c, body)]


def _bound_inside(column: exp.Column, body: exp.Expr) -> bool:
    name = column.table
    node: exp.Expr | None = column
    while node is not None:
        if isinstance(node, exp.Select) and name in from_items(node):
            return True
        if isinstance(node, exp.Query) and name in _cte_names(node):
            return True
        if node is body:
            return False
        node = node.parent
    return False


def _cte_names(query: exp.Expr) -> set[str]:
    return {c.alias_or_name for c in ctes_of(query)}


def ctes_of(query: exp.Expr) -> list[exp.CTE]:
    """The CTEs of a query's own WITH clause, in order."""
    with_ = query.args.get("with_") or query.args.get("with")
    return list(with_.expressions) if isinstance(with_, exp.With) else []
