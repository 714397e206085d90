"""Rewrite ``[NOT] EXISTS (SELECT ... FROM t WHERE ...)`` in a WHERE clause into a SEMI (ANTI) JOIN.

sqlglot decorrelates such subqueries into GROUP BY + ARRAY_AGG + LIST_FILTER when the correlation
has a non-equality (TPC-H Q21's ``l2.l_suppkey <> l1.l_suppkey``), which is far slower than a join.
A semi/anti join with the whole condition in ON is exact for EXISTS / NOT EXISTS (NULLs included),
and the distribution rules can then co-locate it. Runs as an optimizer rule after qualify.
"""

from __future__ import annotations

from sqlglot import exp

from duckflock.sql.scopes import conjuncts, from_items

_BLOCKING = ("group", "having", "limit", "offset", "order", "distinct", "qualify", "joins", "with_", "with")


def _candidate(sub: exp.Expr) -> exp.Select | None:
    """The subquery's SELECT when it is a plain filtered scan of one table."""
    if not isinstance(sub, exp.Select) or any(sub.args.get(a) for a in _BLOCKING):
        return None
    from_ = sub.args.get("from_") or sub.args.get("from")
    if (
        from_ is None
        or not isinstance(from_.this, exp.Table)
        or not isinstance(from_.this.this, exp.Identifier)
    ):
        return None
    if any(True for _ in sub.find_all(exp.Subquery, exp.Exists, exp.AggFunc, exp.Window)):
        return None
    # unnest() in the SELECT list sets how many rows each scanned row gives (none for an empty
    # list): the subquery may be empty where its filtered scan is not.
    if any(True for e in sub.expressions for _ in e.find_all(exp.Explode, exp.Unnest)):
        return None
    return sub


def exists_to_semi_join(expression: exp.Expr, **_: object) -> exp.Expr:
    counter = 0
    for select in list(expression.find_all(exp.Select)):
        where = select.args.get("where")
        if where is None or not (select.args.get("from_") or select.args.get("from")):
            continue
        keep: list[exp.Expr] = []
        for conj in conjuncts(where.this):
            negated = isinstance(conj, exp.Not) and isinstance(conj.this, exp.Exists)
            exists = conj.this if negated else conj
            sub = _candidate(exists.this) if isinstance(exists, exp.Exists) else None
            if sub is None:
                keep.append(conj)
                continue
            from_ = sub.args.get("from_") or sub.args.get("from")
            assert from_ is not None  # _candidate only returns SELECTs with a FROM
            table = from_.this.copy()
            inner = table.alias_or_name
            if inner in from_items(select):  # the outer query uses the alias: give the inner one its own
                counter += 1
                fresh = f"_semi{counter}"
                for col in sub.find_all(exp.Column):
                    if col.table == inner:
                        col.set("table", exp.to_identifier(fresh))
                table.set("alias", exp.TableAlias(this=exp.to_identifier(fresh)))
            cond = sub.args["where"].this.copy() if sub.args.get("where") else exp.true()
            kind = "ANTI" if negated else "SEMI"
            select.append("joins", exp.Join(this=table, kind=kind, on=cond))
        if len(keep) != len(conjuncts(where.this)):
            select.set("where", exp.Where(this=exp.and_(*keep)) if keep else None)
    return expression
