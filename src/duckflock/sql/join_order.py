"""sqlglot's ``optimize_joins``, kept from two moves that change what a join can see.

It pulls a later join's ON conjuncts that mention a cross-joined table into that table's join,
and then orders the joins by the tables their ON clauses name. Two of our joins break this:

- a SEMI join (EXISTS, see semijoin.py) passes on only its left side's columns, so a conjunct
  moved out of its ON into an earlier join names a table that is gone. sqlglot already keeps ANTI
  joins' conjuncts in place; SEMI joins are shown to it as ANTI for the call.
- a LATERAL item reads earlier tables without an ON clause, so the ordering may put it first.
- an ASOF join matches each left row to one right row: a conjunct moved out of its ON into an
  earlier cross join filters the pairs instead of choosing the match.
A SELECT with either keeps its joins as written.
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.optimizer.optimize_joins import optimize_joins as _sqlglot_optimize_joins

from duckflock.sql.rewrite_hazards import is_asof


def optimize_joins(expression: exp.Expr) -> exp.Expr:
    semis = [j for j in expression.find_all(exp.Join) if (j.kind or "").upper() == "SEMI"]
    held: list[tuple[exp.Select, list[exp.Join]]] = []
    for select in expression.find_all(exp.Select):
        joins = select.args.get("joins") or []
        if any(isinstance(j.this, exp.Lateral) or is_asof(j) for j in joins):
            held.append((select, joins))
    try:
        for j in semis:
            j.set("kind", "ANTI")
        for select, _ in held:
            select.set("joins", None)
        expression = _sqlglot_optimize_joins(expression)
    finally:
        for j in semis:
            j.set("kind", "SEMI")
        for select, joins in held:
            select.set("joins", joins)
    return expression
