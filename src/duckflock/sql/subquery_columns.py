"""Where a subquery sits in an expression that no plan node can carry it in.

Only Filter and Project nodes carry subqueries (plan/nodes.py ``WithSubqueries``): their results
are broadcast to every rank that evaluates the expression, or, when correlated, DuckDB evaluates
them inline over whole inputs. A subquery inside an aggregate's arguments or FILTER, in a group
key, or in the condition of a join that is not an inner one, is evaluated per input row all the
same; so the smallest expression around it that is a value of one row (``x IN (SELECT ...)``,
``x = ANY (SELECT ...)``, ``EXISTS (...)``, a scalar subquery) becomes a column of a projection
below, and the aggregate or join reads that column. DuckDB computes the same expression over the
same row either way, so NULLs, empty results and the error of a scalar subquery with several rows
are DuckDB's own.
"""

from __future__ import annotations

from collections.abc import Container

from sqlglot import exp

from duckflock.sql.scopes import query_of


def token_of(node: exp.Expr, tokens: Container[str]) -> str | None:
    """The token a subquery's stand-in (``(SELECT * FROM "__sq3")``) reads, if ``node`` is one."""
    if not isinstance(node, exp.Subquery | exp.Exists) or not isinstance(node.this, exp.Select):
        return None
    from_ = node.this.args.get("from_")
    name = from_.this.name if from_ is not None else None
    return name if name in tokens else None


def stand_ins(e: exp.Expr, tokens: Container[str]) -> list[exp.Expr]:
    """The subqueries' stand-ins in ``e``."""
    return [n for n in e.find_all(exp.Subquery, exp.Exists) if token_of(n, tokens)]


def value_root(stand_in: exp.Expr) -> exp.Expr:
    """The smallest expression around a subquery's stand-in that is a value on its own: the IN or
    the ANY / ALL comparison it is the right side of, else the subquery itself."""
    parent = stand_in.parent
    if isinstance(parent, exp.In) and parent.args.get("query") is stand_in:
        return parent
    if isinstance(parent, exp.Any | exp.All) and isinstance(parent.parent, exp.Binary):
        return parent.parent
    return stand_in


def row_columns(e: exp.Expr) -> set[str]:
    """The plan columns ``e`` reads itself, not inside a subquery's stand-in (the expressions
    are detached copies: any query in them is a stand-in)."""
    return {c.name for c in e.find_all(exp.Column) if query_of(c) is None}
