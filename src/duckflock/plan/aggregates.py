"""Splitting aggregates into a partial phase (before the shuffle) and a final phase (after it).

HyPer's pre-aggregation: each rank reduces its rows to one per group before anything crosses the
network. SUM/COUNT/MIN/MAX/AVG combine directly; VAR/STDDEV combine (count, mean, M2) per rank with
Chan et al.'s parallel formula (the global mean comes from a window over the partials, so nothing
cancels catastrophically); DISTINCT aggregates over one argument deduplicate (group, value) pairs
before the shuffle. Anything else shuffles raw rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from duckflock.catalog.partitioning import quote_ident as q


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
    exp.VariancePop: ("var", "pop"),
    exp.Variance: ("var", "samp"),
    exp.StddevPop: ("sd", "pop"),
    exp.StddevSamp: ("sd", "samp"),
    exp.Stddev: ("sd", "samp"),
}


def _distinct_split(nodes: list[exp.Expression], fresh) -> Split | None:
    """All aggregates DISTINCT over one and the same argument: dedupe before the shuffle."""
    args = set()
    for node in nodes:
        if not isinstance(node.this, exp.Distinct) or len(node.this.expressions) != 1:
            return None
        if not isinstance(node, exp.Count | exp.Sum | exp.Avg | exp.Min | exp.Max):
            return None
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


def split_aggregates(aggs: tuple[str, ...], fresh, group_cols: tuple[str, ...] = ()) -> Split | None:
    """Partial/final decomposition, or None when some aggregate does not decompose.
    ``group_cols``: the final phase's group columns (SQL), for windows over the partials."""
    nodes = [sqlglot.parse_one(sql, read="duckdb") for sql in aggs]
    if any(isinstance(n.this, exp.Distinct) or n.args.get("distinct") for n in nodes):
        return _distinct_split(nodes, fresh)
    partial: list[tuple[str, str]] = []
    final: list[tuple[str, str]] = []
    result: list[str] = []
    windows: list[tuple[str, str]] = []
    over = f"OVER (PARTITION BY {', '.join(group_cols)})" if group_cols else "OVER ()"

    def add(partial_sql: str, final_fn: str) -> str:
        p = fresh("p")
        f = fresh("f")
        partial.append((p, partial_sql))
        final.append((f, f"{final_fn}({q(p)})"))
        return f

    for node in nodes:
        arg = node.this.sql(dialect="duckdb") if node.this is not None else None
        if isinstance(node, exp.Count):
            f = add(f"COUNT({arg or '*'})", "SUM")
            result.append(f"CAST(COALESCE({q(f)}, 0) AS BIGINT)")
        elif isinstance(node, exp.Sum):
            f = add(f"SUM({arg})", "SUM")
            result.append(q(f))
        elif isinstance(node, exp.Min | exp.Max):
            fn = "MIN" if isinstance(node, exp.Min) else "MAX"
            result.append(q(add(f"{fn}({arg})", fn)))
        elif isinstance(node, exp.Avg):
            s = add(f"SUM({arg})", "SUM")
            c = add(f"COUNT({arg})", "SUM")
            result.append(f"CAST({q(s)} AS DOUBLE) / NULLIF({q(c)}, 0)")
        elif type(node) in _VARIANCE and not node.args.get("expression"):
            # Per rank (n, mean, M2); globally M2 = sum(M2_i) + sum(n_i * (mean_i - mean)^2).
            n, mean, m2, gmean = fresh("p"), fresh("p"), fresh("p"), fresh("w")
            partial += [(n, f"COUNT({arg})"), (mean, f"AVG({arg})"), (m2, f"VAR_POP({arg}) * COUNT({arg})")]
            windows.append((gmean, f"SUM({q(n)} * {q(mean)}) {over} / NULLIF(SUM({q(n)}) {over}, 0)"))
            big_n, big_m2 = fresh("f"), fresh("f")
            final += [
                (big_n, f"SUM({q(n)})"),
                (big_m2, f"SUM(COALESCE({q(m2)}, 0) + {q(n)} * ({q(mean)} - {q(gmean)}) ** 2)"),
            ]
            kind, pop = _VARIANCE[type(node)]
            m2_sql = f"GREATEST({q(big_m2)}, 0)"
            var = (
                f"{m2_sql} / NULLIF({q(big_n)}, 0)"
                if pop == "pop"
                else f"CASE WHEN {q(big_n)} > 1 THEN {m2_sql} / ({q(big_n)} - 1) END"
            )
            result.append(f"SQRT({var})" if kind == "sd" else var)
        else:
            return None
    return Split(tuple(partial), tuple(final), tuple(result), windows=tuple(windows))
