"""Column positions as DuckDB's parser reads them.

DuckDB takes an integer in ORDER BY, GROUP BY or DISTINCT ON as a position also when it is wrapped
in parentheses or negated twice (``ORDER BY (2)``, ``- -2``): it folds those before binding, while
sqlglot and the binder see an expression, a constant to sort or group by. Such terms become the
plain integer here; an odd number of negations is a negative position, which DuckDB rejects.
"""

from __future__ import annotations

from sqlglot import exp

from duckflock.errors import SqlError


def plain_positions(tree: exp.Expr) -> exp.Expr:
    for query in list(tree.find_all(exp.Select, exp.SetOperation)):
        order = query.args.get("order")
        group = query.args.get("group")
        distinct = query.args.get("distinct")
        on = distinct.args.get("on") if isinstance(distinct, exp.Distinct) else None  # a UNION's: a bool
        for term in [
            *(o.this for o in (order.expressions if order else [])),
            *(group.expressions if group else []),
            *((on.expressions if isinstance(on, exp.Tuple) else [on]) if on is not None else []),
        ]:
            _plain(term)
    return tree


def _plain(term: exp.Expr) -> None:
    inner, negations = term, 0
    while isinstance(inner, exp.Paren | exp.Neg):
        negations += isinstance(inner, exp.Neg)
        inner = inner.this
    if inner is term or not (isinstance(inner, exp.Literal) and inner.is_int):
        return
    if negations % 2:
        raise SqlError(f"position {term.sql(dialect='duckdb')} is out of range: positions start at 1")
    term.replace(exp.Literal.number(inner.this))
