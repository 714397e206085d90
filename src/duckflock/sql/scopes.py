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


def defined_aliases(body: exp.Expr) -> set[str]:
    """Every table, derived table and CTE alias a query defines at any depth."""
    out = {t.alias_or_name for t in body.find_all(exp.Table)}
    out |= {s.alias_or_name for s in body.find_all(exp.Subquery) if s.alias_or_name}
    out |= {c.alias_or_name for c in body.find_all(exp.CTE)}
    return out


def outer_columns(body: exp.Expr) -> list[exp.Column]:
    """Columns of ``body`` that belong to an enclosing query (a correlated subquery has some)."""
    defined = defined_aliases(body)
    return [c for c in body.find_all(exp.Column) if c.table and c.table not in defined]
