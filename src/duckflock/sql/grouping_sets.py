"""GROUP BY items as the grouping sets they stand for: ROLLUP and CUBE written out, GROUPING SETS
with a ROLLUP, CUBE or GROUPING SETS inside as the sets of each (SQL's concatenation)."""

from __future__ import annotations

from sqlglot import exp


def item_sets(g: exp.Expr) -> list[list[exp.Expr]]:
    """The grouping sets of one GROUP BY item, each a list of expressions."""
    if isinstance(g, exp.Rollup):  # an element may be several columns: ROLLUP ((a, b), c)
        els = [set_members(e) for e in g.expressions]
        return [[m for el in els[:i] for m in el] for i in range(len(els), -1, -1)]
    if isinstance(g, exp.Cube):
        els = [set_members(e) for e in g.expressions]
        masks = range((1 << len(els)) - 1, -1, -1)
        return [[m for j, el in enumerate(els) if k >> j & 1 for m in el] for k in masks]
    if isinstance(g, exp.GroupingSets):
        nested = (exp.Rollup, exp.Cube, exp.GroupingSets)
        return [
            s for e in g.expressions for s in (item_sets(e) if isinstance(e, nested) else [set_members(e)])
        ]
    return [[unparen_key(g)]]


def set_members(s: exp.Expr) -> list[exp.Expr]:
    """The expressions of one grouping set: (a, b), (a), a or ()."""
    if isinstance(s, exp.Tuple):
        return list(s.expressions)
    return [unparen_key(s)]


def unparen_key(e: exp.Expr) -> exp.Expr:
    """``((k + 1))`` as ``k + 1``: a group key matches the select list's expression without them."""
    while isinstance(e, exp.Paren):
        e = e.this
    return e
