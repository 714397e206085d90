"""Small questions and renderings of sqlglot trees that the builder (sql/builder.py) asks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from sqlglot import exp
from sqlglot.errors import ErrorLevel

from duckflock.sql.functions import Aggregates
from duckflock.sql.scopes import outer_columns

E = TypeVar("E", bound=exp.Expr)


def parenthesized(e: exp.Expr) -> exp.Expr:
    """``e`` as an operand: in parentheses unless it is one token or a call (sqlglot's AND, OR and
    operators such as POW are calls to it too: they get them)."""
    operator = isinstance(e, exp.Binary | exp.Connector | exp.Unary)
    atomic = isinstance(e, exp.Column | exp.Literal | exp.Paren) or (isinstance(e, exp.Func) and not operator)
    return e if atomic else exp.Paren(this=e)


def col(name: str) -> exp.Column:
    return exp.column(name, quoted=True)


def to_sql(e: exp.Expr) -> str:
    # Raise, rather than write SQL that means something else, where sqlglot cannot render a node.
    return e.sql(dialect="duckdb", unsupported_level=ErrorLevel.RAISE)


def conjuncts(e: exp.Expr) -> list[exp.Expr]:
    """Split an AND tree (through parentheses), dropping literal TRUE left behind by rewrites."""
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.And):
        return conjuncts(e.this) + conjuncts(e.expression)
    if isinstance(e, exp.Boolean) and e.this is True:
        return []
    return [e]


def first_arg(call: exp.Expr) -> str | None:
    """SQL of an aggregate call's first argument (None for COUNT(*) and argument-less calls)."""
    first = call.this if not isinstance(call, exp.Anonymous | exp.AnonymousAggFunc) else None
    if isinstance(call, exp.Anonymous | exp.AnonymousAggFunc) and call.expressions:
        first = call.expressions[0]
    if isinstance(first, exp.Distinct):
        first = first.expressions[0] if len(first.expressions) == 1 else None
    if not isinstance(first, exp.Expr) or isinstance(first, exp.Star | exp.Order):
        return None
    return to_sql(first)


def outer_aggregate(body: exp.Expr, aggregates: Aggregates) -> bool:
    """Whether an aggregate inside the subquery reads an outer column: SQL then aggregates it in
    the outer query, which the builder (planning scopes one by one) would not see."""
    outer = {id(c) for c in outer_columns(body)}
    return any(
        aggregates.is_call(f) and any(id(c) in outer for c in f.find_all(exp.Column))
        for f in body.find_all(exp.Func)
    )


def unparen(e: exp.Expr) -> exp.Expr:
    while isinstance(e, exp.Subquery) and not e.alias:
        e = e.this
    return e


def outermost(roots: list[exp.Expr]) -> list[exp.Expr]:
    """The expressions that are not part of another one of them (its column computes both)."""
    ids = {id(r) for r in roots}
    out: list[exp.Expr] = []
    for r in roots:
        p = r.parent
        while p is not None and id(p) not in ids:
            p = p.parent
        if p is None and all(r is not o for o in out):
            out.append(r)
    return out


def column_names(e: exp.Expr) -> set[str]:
    return {c.name for c in e.find_all(exp.Column)}


def scope_find(s: exp.Expr, kind: type[E]) -> Iterator[E]:
    """Nodes of ``kind`` in this SELECT, not inside its WITH clause (CTE bodies are their own scopes)."""
    for key, value in s.args.items():
        if key in ("with_", "with"):
            continue
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, exp.Expr):
                yield from v.find_all(kind)
