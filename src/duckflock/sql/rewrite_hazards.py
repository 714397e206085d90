"""Queries on which sqlglot's ``pushdown_predicates`` would change the answer, and what to do instead.

- It copies a derived table's column expression into each predicate it moves into that table; a
  volatile one (``random()``) is then drawn once per copy instead of once per row. A CTE referenced
  twice would also be computed twice by the plan. Such queries (a volatile function in the SELECT
  list of a nested query, or anywhere in a CTE read twice) are not distributed: the driver answers
  them as written.
- It moves a predicate into the derived table or CTE it reads and rewrites that name's columns
  inside it, including inside a subquery whose own FROM item has the same name
  (``(SELECT ...) x WHERE x.id IN (SELECT x.id FROM u AS x)``): such FROM items are renamed
  (sql/shadowing.py); a subquery's own CTE of such a name makes the query skip the rule.
- The plan computes a CTE once per reference, DuckDB once for all of them: where its rows depend
  on row order (LIMIT, a sample, DISTINCT ON, a window, first() and the like over ties), two
  references could hold different rows. Such a CTE read more than once sends the query to the
  driver.
- It treats an ASOF join as an inner join: a WHERE conjunct on the right side moves into the ON
  clause, so it filters the candidates before the match instead of the matches after it. A query
  with an ASOF join skips the rule (the plan's own pushdown keeps such filters above the join).
"""

from __future__ import annotations

from sqlglot import exp

from duckflock.sql.allowlist import unsupported
from duckflock.sql.functions import function_name
from duckflock.sql.scopes import query_of

_PUSHDOWN = "pushdown_predicates"
# DuckDB's VOLATILE functions whose value differs per call (not error(), which only raises).
_VOLATILE_KEEP = frozenset({"error"})
# Aggregates whose value depends on the order rows arrive in (among ties, or floats summed in turn).
_ORDER_DEPENDENT = frozenset(
    {
        "first", "last", "any_value", "arbitrary", "list", "array_agg", "string_agg", "group_concat",
        "listagg", "arg_min", "arg_max", "argmin", "argmax", "min_by", "max_by", "arg_min_null",
        "arg_max_null", "mode", "fsum", "sumkahan", "kahan_sum", "reservoir_quantile", "approx_quantile",
    }
)  # fmt: skip


def rules_to_skip(tree: exp.Expr, volatile: frozenset[str]) -> set[str]:
    """The rule names to leave out for ``tree`` (before qualify); raises SqlError (so that the
    driver answers the query as written) for volatile functions below the outermost query."""
    for call in tree.find_all(exp.Func):
        name = function_name(call)
        if name in volatile and name not in _VOLATILE_KEEP and _copied(call, tree):
            raise unsupported(f"a volatile function ({name}) in a derived table's or CTE's columns")
    for cte in tree.find_all(exp.CTE):
        what = _order_dependent(cte.this)
        if what and _references(tree, cte.alias_or_name) > 1:
            raise unsupported(f"a CTE read more than once whose rows depend on row order ({what})")
    if any(is_asof(j) for j in tree.find_all(exp.Join)):
        return {_PUSHDOWN}
    derived = _derived_names(tree)
    return {_PUSHDOWN} if derived and _nested_cte_named(tree, set(derived)) else set()


def is_asof(join: exp.Join) -> bool:
    return (join.args.get("method") or "").upper() == "ASOF"


def _copied(call: exp.Expr, tree: exp.Expr) -> bool:
    """Whether a rewrite or the plan may evaluate ``call`` more than once per row: it is in the
    SELECT list of a query below the outermost one, or anywhere in a CTE read more than once."""
    node: exp.Expr | None = call
    while node is not None and node is not tree:
        parent = node.parent
        selected = isinstance(parent, exp.Select) and any(node is e for e in parent.expressions)
        if selected and parent is not tree:
            return True
        if isinstance(node, exp.CTE) and _references(tree, node.alias_or_name) > 1:
            return True
        node = parent
    return False


def _order_dependent(body: exp.Expr) -> str | None:
    """What makes a query's rows depend on the order rows arrive in, if anything does."""
    for node in body.walk():
        if isinstance(node, exp.Limit | exp.Offset | exp.Fetch):
            return "LIMIT / OFFSET"
        if isinstance(node, exp.TableSample):
            return "a sample"
        if isinstance(node, exp.Distinct) and node.args.get("on") is not None:
            return "DISTINCT ON"
        if isinstance(node, exp.Window):
            return "a window function"
        name = function_name(node) if isinstance(node, exp.Func) else None
        if name in _ORDER_DEPENDENT:
            return f"{name}()"
    return None


def _references(tree: exp.Expr, name: str) -> int:
    return sum(1 for t in tree.find_all(exp.Table) if t.name.lower() == name.lower() and not t.args.get("db"))


def _derived_names(tree: exp.Expr) -> dict[str, exp.Expr]:
    """Lower-case name -> body of every CTE and derived table in the query."""
    out: dict[str, exp.Expr] = {}
    for cte in tree.find_all(exp.CTE):
        out[cte.alias_or_name.lower()] = cte.this
    for sub in tree.find_all(exp.Subquery):
        if sub.alias_or_name and isinstance(sub.parent, exp.From | exp.Join):
            out[sub.alias_or_name.lower()] = sub.this
    return out


def _nested_cte_named(tree: exp.Expr, names: set[str]) -> bool:
    """Whether a nested query defines a CTE under one of ``names`` (of an enclosing query)."""
    return any(query_of(q) is not None and _ctes_of(q) & names for q in tree.find_all(exp.Query))


def _ctes_of(query: exp.Expr) -> set[str]:
    with_ = query.args.get("with_") or query.args.get("with")
    return {c.alias_or_name.lower() for c in with_.expressions} if with_ is not None else set()
