"""ASOF joins written in forms the binder does not read, rewritten to ones it does.

- ``a ASOF SEMI JOIN b ON ...`` and ``ASOF ANTI`` (or ``USING``): a plain SEMI or ANTI join on the
  same condition.
  Whether a left row has an ASOF match is whether any right row meets the condition; which one is
  nearest does not matter when no right column is kept.
- ``a ASOF [LEFT] JOIN b USING (k, t)``: sqlglot's qualification reads USING as for any join,
  merging each column as COALESCE of both sides and joining on ``a.k = b.k AND a.t = b.t``; DuckDB
  joins on ``a.k = b.k AND a.t >= b.t``, so the last condition is set so after qualification (the
  join is marked before). The merged columns are then DuckDB's: the left side's value, as a row
  with an ASOF match has a non-NULL ``a.t`` and one without has none of b's columns.
"""

from __future__ import annotations

from sqlglot import exp

_MARK = "asof_using"  # Join.meta key: the USING column compared with >=


def _asof(join: exp.Join) -> bool:
    return (join.args.get("method") or "").upper() == "ASOF"


def _named(node: exp.Expr, name: str) -> bool:
    return isinstance(node, exp.Column) and node.name.lower() == name.lower()


def asof_semi_anti_as_plain(tree: exp.Expr) -> exp.Expr:
    for join in tree.find_all(exp.Join):
        kind = (join.args.get("kind") or "").upper()
        if _asof(join) and kind in ("SEMI", "ANTI"):  # USING: marked before (mark_asof_using)
            join.set("method", None)
    return tree


def mark_asof_using(tree: exp.Expr) -> exp.Expr:
    """Mark each ASOF join with USING by the column it compares with >= (its last)."""
    for join in tree.find_all(exp.Join):
        using = join.args.get("using") or []
        if _asof(join) and using:
            join.meta[_MARK] = using[-1].name
    return tree


def asof_using_as_inequality(expression: exp.Expr) -> exp.Expr:
    """After qualification: a marked join's ``left.t = right.t`` as ``left.t >= right.t``."""
    for join in expression.find_all(exp.Join):
        name = join.meta.get(_MARK)
        if name is None:
            continue
        right = join.this.alias_or_name
        for eq in list(join.args["on"].find_all(exp.EQ)):
            # The right side's column, and the left's: a column, or after an earlier USING join
            # on it, COALESCE of the columns it merged.
            for this, other in ((eq.expression, eq.this), (eq.this, eq.expression)):
                if _named(this, name) and this.table == right and any(_named(c, name) for c in other.walk()):
                    eq.replace(exp.GTE(this=other.copy(), expression=this.copy()))
                    break
        del join.meta[_MARK]
    return expression
