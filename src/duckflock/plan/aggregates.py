"""Splitting aggregates into a partial phase (before the shuffle) and a final phase (after it).

HyPer's pre-aggregation: each rank reduces its rows to one per group before anything crosses the
network. Only the aggregates listed here are split, each for the argument types where combining
partials is exact; every other aggregate (DuckDB has many) moves its raw rows. COUNT, SUM, MIN,
MAX, AVG, PRODUCT, BOOL_AND/OR, BIT_AND/OR/XOR and COUNT_IF combine directly, FILTER included
(AVG finished as DuckDB finishes it, to the last bit: duckdb_avg.py);
VAR/STDDEV combine (count, mean, M2) per rank with Chan et al.'s parallel formula (the global mean
comes from a window over the partials, so nothing cancels catastrophically); DISTINCT aggregates
over one argument deduplicate (group, value) pairs before the shuffle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from duckflock import duckdb_avg
from duckflock.sql.functions import WRAPPERS, function_name
from duckflock.sqltext import quote_ident as q


@dataclass(frozen=True)
class Split:
    partial: tuple[tuple[str, str], ...]  # (column, aggregate SQL over the input rows)
    final: tuple[tuple[str, str], ...]  # (column, aggregate SQL over the partial columns)
    result: tuple[str, ...]  # expression over the final columns giving each original aggregate
    # Extra partial GROUP BY keys (column, SQL): the argument of DISTINCT aggregates.
    partial_groups: tuple[tuple[str, str], ...] = ()
    # Window columns (column, SQL) computed over the partials before the final aggregate.
    windows: tuple[tuple[str, str], ...] = ()


_VARIANCE = {
    "var_pop": ("var", "pop"),
    "var_samp": ("var", "samp"),
    "variance": ("var", "samp"),
    "stddev_pop": ("sd", "pop"),
    "stddev_samp": ("sd", "samp"),
    "stddev": ("sd", "samp"),
}
# Aggregates whose partials combine with one aggregate of the same kind (exact: these are
# associative and commutative over their input multiset), by the argument types they take.
_SELF_COMBINING = {
    "min": "any",
    "max": "any",
    "sum": "numeric",
    "product": "numeric",
    "bool_and": "boolean",
    "bool_or": "boolean",
    "bit_and": "integer",
    "bit_or": "integer",
    "bit_xor": "integer",
}
_INTEGERS: tuple[str, ...] = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT")
_INTEGERS += ("UINTEGER", "UBIGINT", "UHUGEINT")


def _takes(arg_type: str, kind: str) -> bool:
    t = arg_type.upper()
    if kind == "any":
        return True
    if kind == "boolean":
        return t == "BOOLEAN"
    if kind == "integer":
        return t in _INTEGERS
    return t in _INTEGERS or t in ("FLOAT", "DOUBLE") or t.startswith("DECIMAL")


def _arguments(call: exp.Expr) -> list[exp.Expr]:
    return [a for a in call.iter_expressions() if not isinstance(a, exp.Identifier)]


def _distinct_split(nodes: list[exp.Expr], fresh) -> Split | None:
    """All aggregates DISTINCT over one and the same argument: dedupe before the shuffle."""
    args = set()
    for node in nodes:
        if not isinstance(node, exp.Count | exp.Sum | exp.Avg | exp.Min | exp.Max):
            return None
        if not isinstance(node.this, exp.Distinct) or len(node.this.expressions) != 1:
            return None
        if isinstance(node, exp.Min | exp.Max) and node.args.get("count") is not None:
            return None  # max(DISTINCT x, n): its n largest values, not one (rebuilt below without n)
        args.add(node.this.expressions[0].sql(dialect="duckdb"))
    if len(args) != 1:
        return None
    value = fresh("d")
    final, result = [], []
    for node in nodes:
        f = fresh("f")
        final.append((f, f"{node.key.upper()}(DISTINCT {q(value)})"))
        result.append(q(f) if not isinstance(node, exp.Count) else f"CAST({q(f)} AS BIGINT)")
    return Split((), tuple(final), tuple(result), partial_groups=((value, args.pop()),))


def _is_distinct(node: exp.Expr) -> bool:
    """Whether an aggregate call is DISTINCT, FILTER or not (a per-rank partial of a DISTINCT
    aggregate would count a value once on every rank holding it)."""
    call = node.this if isinstance(node, exp.Filter) else node
    if isinstance(call, exp.Anonymous):  # a function sqlglot does not know: mean(DISTINCT x)
        return any(isinstance(e, exp.Distinct) for e in call.expressions)
    return isinstance(call.this, exp.Distinct) or bool(call.args.get("distinct"))


def split_aggregates(
    aggs: tuple[str, ...],
    fresh,
    group_cols: tuple[str, ...] = (),
    arg_types: tuple[str, ...] = (),
    grouping: str = "",
    final_groups: tuple[tuple[str, str], ...] = (),
) -> Split | None:
    """Partial/final decomposition, or None when some aggregate is not on the allow-list below.
    ``group_cols``: the final phase's group columns (SQL), for windows over the partials;
    ``arg_types``: DuckDB type of each aggregate's first argument; ``grouping``: how the original
    aggregate groups ("none", "groups" or "sets"; default: "groups" with ``group_cols``), which
    decides how DuckDB finishes an AVG (_avg_rewritten); ``final_groups``: (SQL, final column) of
    each group key, for GROUPING(), which the final phase computes over its grouping sets."""
    nodes = [sqlglot.parse_one(sql, read="duckdb") for sql in aggs]
    if any(_is_distinct(n) for n in nodes):
        return _distinct_split(nodes, fresh)
    over = f"OVER (PARTITION BY {', '.join(group_cols)})" if group_cols else "OVER ()"
    context = _Context(nodes, grouping or ("groups" if group_cols else "none"), over, fresh, final_groups)
    splits = [_split_one(n, t, context) for n, t in zip(nodes, arg_types or ("",) * len(nodes), strict=True)]
    if any(one is None for one in splits):
        return None
    parts = [one for one in splits if one is not None]
    return Split(
        tuple(x for one in parts for x in one.partial),
        tuple(x for one in parts for x in one.final),
        tuple(x for one in parts for x in one.result),
        windows=tuple(x for one in parts for x in one.windows),
    )


@dataclass(frozen=True)
class _Context:
    nodes: list[exp.Expr]  # every aggregate of the node
    grouping: str
    over: str  # the window over the partials of one final group
    fresh: Callable[[str], str]
    final_groups: tuple[tuple[str, str], ...]


def _split_one(node: exp.Expr, arg_type: str, c: _Context) -> Split | None:
    """One aggregate's partials, finals, windows and result (None: it does not split)."""
    fresh = c.fresh
    where = ""
    if isinstance(node, exp.Filter):  # agg(x) FILTER (WHERE c): the filter goes to the partial
        where = f" FILTER ({node.expression.sql(dialect='duckdb')})"
        node = node.this
    if isinstance(node, WRAPPERS) or next(node.find_all(exp.Order), None) is not None:
        return None  # IGNORE NULLS, WITHIN GROUP, ORDER BY inside: order-dependent
    name = function_name(node)
    args = _arguments(node)
    if isinstance(node, exp.Grouping | exp.GroupingId):
        return _grouping(args, c)
    if name in ("count", "count_star") and len(args) <= 1:
        arg = "*" if not args or isinstance(args[0], exp.Star) else args[0].sql(dialect="duckdb")
        p, f = fresh("p"), fresh("f")
        return Split(
            ((p, f"COUNT({arg}){where}"),), ((f, f"SUM({q(p)})"),), (f"CAST(COALESCE({q(f)}, 0) AS BIGINT)",)
        )
    if len(args) != 1 or name is None:
        return None
    arg = args[0].sql(dialect="duckdb")
    if name in ("count_if", "countif"):
        p, f = fresh("p"), fresh("f")
        # NULL over no non-NULL input, like SUM
        return Split(((p, f"COUNT_IF({arg}){where}"),), ((f, f"SUM({q(p)})"),), (q(f),))
    if name in _SELF_COMBINING and _takes(arg_type, _SELF_COMBINING[name]):
        p, f = fresh("p"), fresh("f")
        return Split(((p, f"{name.upper()}({arg}){where}"),), ((f, f"{name.upper()}({q(p)})"),), (q(f),))
    if name in ("avg", "mean") and _takes(arg_type, "numeric"):
        s, fs, n, fn = fresh("p"), fresh("f"), fresh("p"), fresh("f")
        rewritten = not where and _avg_rewritten(arg, c.nodes, c.grouping)
        avg = _avg_result(q(fs), q(fn), arg_type, rewritten)
        if avg is None:
            return None
        partial = ((s, f"SUM({arg}){where}"), (n, f"COUNT({arg}){where}"))
        return Split(partial, ((fs, f"SUM({q(s)})"), (fn, f"SUM({q(n)})")), (avg,))
    if name in _VARIANCE and _takes(arg_type, "numeric"):
        p_var, f_var, w_var, r_var = _variance(name, arg, where, c.over, fresh)
        return Split(tuple(p_var), tuple(f_var), (r_var,), windows=tuple(w_var))
    return None


def _grouping(args: list[exp.Expr], c: _Context) -> Split | None:
    """GROUPING(k, ...): nothing per rank; the final phase, grouping by the sets, computes it over
    its columns of those keys (None where an argument is no group key as written)."""
    finals = {sqlglot.parse_one(g, read="duckdb").sql(dialect="duckdb"): col for g, col in c.final_groups}
    keys = [finals.get(a.sql(dialect="duckdb")) for a in args]
    if any(k is None for k in keys):
        return None
    f = c.fresh("f")
    return Split((), ((f, f"GROUPING({', '.join(k for k in keys if k is not None)})"),), (q(f),))


def _avg_result(total: str, count: str, arg_type: str, rewritten: bool) -> str | None:
    """An AVG from the global sum and count of its argument, as DuckDB finishes it (None where that
    cannot be reproduced: the raw rows move instead)."""
    if rewritten or arg_type.upper() in ("FLOAT", "DOUBLE", "UHUGEINT"):
        # SUM / COUNT; a floating sum is as exact as DuckDB's own order of additions
        return f"CAST({total} AS DOUBLE) / NULLIF({count}, 0)"
    return duckdb_avg.finalize_sql(total, count, arg_type)


def _avg_rewritten(arg: str, nodes: list[exp.Expr], grouping: str) -> bool:
    """Whether DuckDB's optimizer turns an unfiltered AVG(arg) of this aggregate into SUM(arg) /
    COUNT(arg), a DOUBLE division that rounds differently from AVG's own (duckdb_avg.py). Found by
    testing DuckDB: always without GROUP BY; never with several grouping sets; with GROUP BY only
    where an unfiltered SUM(arg) or COUNT(arg) is computed beside it (or COUNT(*) where DuckDB's
    statistics know ``arg`` has no NULL, which they do not for Parquet files)."""
    if grouping != "groups":
        return grouping == "none"
    for node in nodes:
        if isinstance(node, exp.Filter) or function_name(node) not in ("sum", "count"):
            continue
        args = _arguments(node)
        if len(args) == 1 and args[0].sql(dialect="duckdb") == arg:
            return True
    return False


def _variance(
    name: str, arg: str, where: str, over: str, fresh
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]], str]:
    """(partials, finals, windows, result) of a variance or standard deviation."""
    # Per rank (n, mean, M2); the mean exact (an integer AVG rounds once). Globally, with
    # d = mean - c for a shift c shared by all ranks (the least mean: the differences are exact,
    # and 0 where all ranks' means are one DOUBLE), M2 = sum(M2_i) + sum(n_i d_i^2) - (sum(n_i d_i))^2 / N.
    # Unshifted, means near 9.2e18 (BIGINTs) or 1e12 left rounding errors of their own magnitude.
    n, mean, m2, odd, shift = fresh("p"), fresh("p"), fresh("p"), fresh("p"), fresh("w")
    partial = [
        (n, f"COUNT({arg}){where}"),
        # A rank's constant values have that value as their mean exactly (as DuckDB's running
        # mean keeps it), not a sum of n copies divided by n (0.1 * 3 / 3 is not 0.1).
        (
            mean,
            f"CASE WHEN MIN({arg}){where} = MAX({arg}){where} THEN CAST(MIN({arg}){where} AS DOUBLE) "
            f"ELSE AVG({arg}){where} END",
        ),
        (m2, f"VAR_POP({arg}){where} * COUNT({arg}){where}"),
        (odd, f"COUNT(CASE WHEN NOT isfinite(CAST({arg} AS DOUBLE)) THEN 1 END){where}"),
    ]
    windows = [(shift, f"MIN({q(mean)}) {over}")]
    big_n, big_s1, big_s2, big_odd = fresh("f"), fresh("f"), fresh("f"), fresh("f")
    dev = f"({q(mean)} - {q(shift)})"
    final = [
        (big_n, f"SUM({q(n)})"),
        (big_s1, f"SUM({q(n)} * {dev})"),
        (big_s2, f"SUM(COALESCE({q(m2)}, 0) + {q(n)} * {dev} ** 2)"),
        (big_odd, f"SUM({q(odd)})"),
    ]
    # An overflowing sum is infinite, as DuckDB's is (inf - inf would be NaN).
    s2 = f"COALESCE({q(big_s2)}, 0)"
    spread = f"COALESCE({q(big_s1)}, 0) ** 2 / NULLIF({q(big_n)}, 0)"
    big_m2 = f"(CASE WHEN isinf({s2}) THEN {s2} ELSE {s2} - {spread} END)"
    kind, pop = _VARIANCE[name]
    m2_sql = f"GREATEST({big_m2}, 0)"
    var = (
        f"{m2_sql} / NULLIF({q(big_n)}, 0)"
        if pop == "pop"
        else f"CASE WHEN {q(big_n)} > 1 THEN {m2_sql} / ({q(big_n)} - 1) END"
    )
    # DuckDB's running update leaves one value's M2 at 0, NaN or infinite as it is; a second value
    # makes it NaN (inf - inf): so do the ranks' (n, mean, M2) here, whatever their order.
    one = "0" if pop == "pop" else "NULL"
    odd_var = f"CASE WHEN {q(big_n)} > 1 THEN CAST('nan' AS DOUBLE) ELSE {one} END"
    var = f"CASE WHEN {q(big_odd)} > 0 THEN ({odd_var}) ELSE {var} END"
    return partial, final, windows, f"SQRT({var})" if kind == "sd" else var
