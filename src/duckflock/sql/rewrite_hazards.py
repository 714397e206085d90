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
- The plan computes a CTE once per reference (and so a CTE another such CTE reads, once per
  reference of that one), DuckDB once for all of them: where its rows depend on row order (LIMIT,
  a sample, DISTINCT ON, a window, first() and the like over ties), two references could hold
  different rows; where it sums floats (sum() of a DOUBLE, var_samp(), corr() and the like), their
  last bits depend on the order partial results meet in, and the references' values may not be
  equal. Such a CTE computed more than once sends the query to the driver.
- normalize rewrites an OR over ANDs in conjunctive form, which evaluates a cast, a remainder or
  another computation that may raise on rows the AND before it kept DuckDB from evaluating it on:
  a query with such a computation in an OR over ANDs skips that rule.
- It treats an ASOF join as an inner join: a WHERE conjunct on the right side moves into the ON
  clause, so it filters the candidates before the match instead of the matches after it. A query
  with an ASOF join skips the rule (the plan's own pushdown keeps such filters above the join).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from duckflock.errors import DuckflockError
from duckflock.sql.allowlist import unsupported
from duckflock.sql.functions import function_name
from duckflock.sql.scopes import query_of

_PUSHDOWN = "pushdown_predicates"
_NORMALIZE = "normalize"
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
# Aggregates that sum or multiply in DOUBLE whatever their input, and those that do for a float input.
_FLOAT_STATE = frozenset(
    {
        "var_samp", "var_pop", "variance", "stddev", "stddev_samp", "stddev_pop", "corr", "covar_samp",
        "covar_pop", "regr_avgx", "regr_avgy", "regr_intercept", "regr_r2", "regr_slope", "regr_sxx",
        "regr_sxy", "regr_syy", "skewness", "kurtosis", "kurtosis_pop", "sem", "favg",
    }
)  # fmt: skip
_FLOAT_INPUT = frozenset({"sum", "avg", "mean", "product", "sum_no_overflow"})
# (name, type) of a query's result columns (SchemaDB.describe).
Describe = Callable[[str], list[tuple[str, str]]]


def rules_to_skip(tree: exp.Expr, volatile: frozenset[str], describe: Describe) -> set[str]:
    """The rule names to leave out for ``tree`` (before qualify); raises NotDistributed (so that the
    driver answers the query as written) for volatile functions below the outermost query."""
    for call in tree.find_all(exp.Func):
        name = function_name(call)
        if name in volatile and name not in _VOLATILE_KEEP and _copied(call, tree):
            where = "in a derived table's or CTE's columns"
            raise unsupported(f"a volatile function ({name}) {where}", f"a volatile function {where}")
    for cte in _computed_repeatedly(tree):
        what = _order_dependent(cte.this) or _float_sum(cte, describe)
        if what:
            construct = "a CTE computed more than once whose result depends on row order"
            raise unsupported(f"{construct} ({what})", construct)
    skip = {_NORMALIZE} if _guarded_failures(tree) else set()
    if any(is_asof(j) for j in tree.find_all(exp.Join)):
        return skip | {_PUSHDOWN}
    derived = _derived_names(tree)
    return skip | ({_PUSHDOWN} if derived and _nested_cte_named(tree, set(derived)) else set())


def _guarded_failures(tree: exp.Expr) -> bool:
    """Whether an OR over ANDs computes from a column something that may raise: DuckDB evaluates
    an AND's terms on the rows the earlier ones kept, so ``(b <> 0 AND a % b = 0) OR g = 1`` takes
    the remainder only where ``b`` is not 0; normalize's conjunctive form ``(b <> 0 OR g = 1) AND
    (a % b = 0 OR g = 1)`` takes it on every row the first term keeps, and fails where DuckDB
    answers. Casts, integer arithmetic (overflow, division by zero) and function calls other than
    a few that never raise count; a computation of constants fails on every row or on none."""
    for node in tree.find_all(exp.Or):
        if any(True for _ in node.find_all(exp.And)) and any(
            isinstance(n, _MAY_RAISE) and not isinstance(n, _NEVER_RAISE) and n.find(exp.Column)
            for n in node.walk()
        ):
            return True
    return False


_MAY_RAISE = (exp.Cast, exp.Func, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Pow, exp.Neg)
# Functions (as sqlglot parses them: AND and OR are functions to it too) that raise for no value of
# their arguments; their arguments are looked at on their own.
_NEVER_RAISE = (
    exp.Connector, exp.TryCast, exp.Case, exp.If, exp.Coalesce, exp.Nullif, exp.Lower, exp.Upper,
    exp.Length, exp.Substring, exp.Concat, exp.Trim,
)  # fmt: skip


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


def _computed_repeatedly(tree: exp.Expr) -> list[exp.CTE]:
    """The CTEs the plan computes more than once: read more than once, or read by one that is."""
    ctes = list(tree.find_all(exp.CTE))
    repeated = [c for c in ctes if _references(tree, c.alias_or_name) > 1]
    grew = True
    while grew:
        grew = False
        for cte in ctes:
            if all(cte is not r for r in repeated) and any(
                _references(r.this, cte.alias_or_name) for r in repeated
            ):
                repeated.append(cte)
                grew = True
    return repeated


def _float_sum(cte: exp.CTE, describe: Describe) -> str | None:
    """An aggregate of the CTE that sums floats (its input's type asked of DuckDB), if any."""
    for call in cte.this.find_all(exp.Func):
        name = function_name(call)
        if name in _FLOAT_STATE:
            return f"{name}()"
        if name in _FLOAT_INPUT and _float_input(cte, call, describe):
            return f"{name}() of a float"
    return None


def _float_input(cte: exp.CTE, call: exp.Func, describe: Describe) -> bool:
    """Whether ``call``'s first argument is a float (or, where that cannot be told, may be)."""
    arg = call.args.get("this")
    if not isinstance(arg, exp.Expr):
        arg = call.expressions[0] if call.expressions else None
    if isinstance(arg, exp.Distinct):
        arg = arg.expressions[0] if arg.expressions else None
    select = query_of(call)
    if arg is None or not isinstance(select, exp.Select):
        return True
    probe = select.copy()
    for clause in ("group", "having", "qualify", "order", "limit", "offset", "distinct", "windows"):
        probe.set(clause, None)
    probe.set("expressions", [arg.copy()])
    with_ = cte.parent
    if isinstance(with_, exp.With) and not probe.args.get("with_"):
        probe.set("with_", with_.copy())
    try:
        types = describe(probe.sql(dialect="duckdb"))
    except DuckflockError:
        return True
    return not types or types[0][1].upper().startswith(("DOUBLE", "FLOAT", "REAL"))


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
