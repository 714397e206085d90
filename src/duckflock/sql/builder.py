"""Map a query in normal form (sql/passes.py) onto plan nodes, clause by clause.

Columns get globally unique names ``alias.column`` so any subtree renders as plain nested SQL; each
uncorrelated subquery is planned on its own and a token table stands for it in the expressions.
FROM and joins are planned in build_from.py, grouping, aggregates and windows in
build_aggregates.py, what every clause asks (names, subqueries, types) in build_base.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

from sqlglot import exp

from duckflock.errors import SqlError
from duckflock.plan.kinds import SetOpKind
from duckflock.plan.nodes import Distinct, Node, Project, SetOp
from duckflock.sql.allowlist import check_supported, unsupported
from duckflock.sql.ast_helpers import col, parenthesized, to_sql, unparen
from duckflock.sql.build_aggregates import AggregateBuilder
from duckflock.sql.build_base import check_key_types
from duckflock.sql.build_from import FromBuilder
from duckflock.sql.row_limits import limited, row_limit
from duckflock.sql.scopes import from_items
from duckflock.sqltext import quote_ident as q


class Builder(FromBuilder, AggregateBuilder):
    """The plan of a query: FROM, then grouping and aggregates, windows, the outputs, DISTINCT,
    ORDER BY and LIMIT; set operations over their sides' plans."""

    def query(self, tree: exp.Expr, prefix: str | None) -> Node:
        """A SELECT (or set operation) as a node whose columns are named prefix.name (or fresh)."""
        with_ = tree.args.get("with_") or tree.args.get("with")
        outer = self.ctes
        if with_ is not None:
            if with_.args.get("recursive"):
                raise unsupported("WITH RECURSIVE")
            for cte in with_.expressions:
                self.ctes = {**self.ctes, cte.alias_or_name: (cte.this, self.ctes)}
        try:
            if isinstance(tree, exp.SetOperation):
                return self.set_operation(tree, prefix)
            if not isinstance(tree, exp.Select):
                raise unsupported(tree.key.upper())
            return self.select(tree, prefix)
        finally:
            self.ctes = outer

    def select(self, s: exp.Select, prefix: str | None) -> Node:
        check_supported(s)  # sqlglot's rewrites may have built clauses of their own
        rel = self.from_(s)
        s, lifted = self.lift_outer_aggregates(s)
        selects = [self.names(e.copy()) for e in s.expressions]
        out_names = [e.alias_or_name for e in s.expressions]
        order_keys = self.order_keys(s, len(selects))
        having = self.names(s.args["having"].this.copy()) if s.args.get("having") else None
        qualify_ = self.names(s.args["qualify"].this.copy()) if s.args.get("qualify") else None
        scoped = [*selects, *order_keys, *(e for e in (having, qualify_) if e is not None)]
        # HAVING alone makes the query an aggregate too: one group of all rows, also of none.
        group = s.args.get("group")
        aggregated = having is not None or bool(lifted) or any(self.aggregates.units(e) for e in scoped)
        own = set(from_items(s))  # an output reads this query's rows where it names one of these
        reads = [any(c.table in own for c in e.find_all(exp.Column)) for e in s.expressions]
        groups, sets = self.group_keys(group, [e for e, r in zip(selects, reads, strict=True) if r], scoped)
        # GROUP BY ALL of constants only, with nothing aggregated, is no grouping in DuckDB.
        if (group is not None and (groups or sets is not None or not group.args.get("all"))) or aggregated:
            rel, selects, order_keys, having, qualify_ = self.aggregate(
                rel, groups, selects, order_keys, having, qualify_, sets, lifted
            )
            if having is not None:
                rel = self.filter(rel, [having])
        rel, selects, order_keys, qualify_ = self.windows(rel, selects, order_keys, qualify_)
        if qualify_ is not None:  # QUALIFY: a filter over the window functions' results
            rel = self.filter(rel, [qualify_])
        names = [f"{prefix}.{n}" if prefix else self.fresh("o") for n in out_names]
        exprs = [to_sql(e.unalias() if isinstance(e, exp.Alias) else e) for e in selects]
        aliases = {n: selects[i].unalias() for i, n in enumerate(out_names) if out_names.count(n) == 1}
        # Output columns, plus hidden ones for ORDER BY keys that are not among them.
        sort_keys = [self.sort_key(s, o, out_names, aliases, names, exprs) for o in order_keys]
        rel = Project(tuple(names), child=rel, exprs=tuple(exprs), **self.attach(" ".join(exprs)))
        if s.args.get("distinct"):
            if s.args["distinct"].args.get("on"):
                raise unsupported("DISTINCT ON")
            rel = Distinct(
                rel.columns, child=rel, key_types=self.hash_types(rel, [q(c) for c in rel.columns])
            )
        return limited(rel, tuple(names[: len(out_names)]), sort_keys, row_limit(s, self), self)

    def order_keys(self, s: exp.Select, outputs: int) -> list[exp.Expr]:
        """The ORDER BY keys in plan names; ORDER BY ALL is every output column, left to right, in
        the given direction."""
        order = s.args.get("order")
        keys = [self.names(o.copy()) for o in order.expressions] if order else []
        if len(keys) != 1 or not isinstance(keys[0].this, exp.Var) or keys[0].name.upper() != "ALL":
            return keys
        expanded = []
        for i in range(outputs):
            o = keys[0].copy()
            o.set("this", exp.Literal.number(i + 1))
            expanded.append(o)
        return expanded

    def sort_key(
        self,
        s: exp.Select,
        o: exp.Expr,
        out_names: list[str],
        aliases: dict[str, exp.Expr],
        names: list[str],
        exprs: list[str],
    ) -> str:
        """One ORDER BY key as SQL over the output column it sorts by: an output named or numbered,
        an output expression written again, or else a hidden column appended to ``names``/``exprs``."""
        key = o.this
        for c in [key, *key.find_all(exp.Column)]:
            if isinstance(c, exp.Column) and not c.table and out_names.count(c.name) > 1:
                # DuckDB picks one (the last); which one is its rule to tell, not this binder's.
                what = "ORDER BY a name several output columns have"
                raise unsupported(f"{what} ({c.name}): ambiguous to duckflock", what)
        if isinstance(key, exp.Column) and not key.table and key.name in out_names:
            hit: str | None = names[out_names.index(key.name)]
        elif isinstance(key, exp.Literal) and key.is_int:
            hit = names[int(key.this) - 1]
        else:  # an expression, maybe over output aliases: write them out
            # In parentheses: ORDER BY -z over z = b - a is -(b - a), not -b - a.
            key = key.transform(
                lambda n: (
                    parenthesized(aliases[n.name].copy())
                    if isinstance(n, exp.Column) and not n.table and n.name in aliases
                    else n
                )
            )
            hit = names[exprs.index(to_sql(key))] if to_sql(key) in exprs else None
        if hit is None:
            if s.args.get("distinct"):
                raise unsupported("SELECT DISTINCT ordered by an expression not in its select list")
            hit = self.fresh("s")
            names.append(hit)
            exprs.append(to_sql(key))
        o = o.copy()
        o.set("this", col(hit))
        return to_sql(o)

    def set_operation(self, tree: exp.SetOperation, prefix: str | None) -> Node:
        left = self.query(unparen(tree.left), prefix=None)
        right = self.query(unparen(tree.right), prefix=None)
        names = tree.named_selects
        if tree.args.get("by_name"):
            left, right, names = self.by_name(tree, left, right)
        if len(left.columns) != len(right.columns):
            raise SqlError(f"{tree.key.upper()} inputs have different numbers of columns")
        cols = tuple(f"{prefix}.{n}" if prefix else self.fresh("o") for n in names)
        kind = {exp.Union: SetOpKind.UNION, exp.Intersect: SetOpKind.INTERSECT, exp.Except: SetOpKind.EXCEPT}[
            type(tree)
        ]
        rel: Node = SetOp(
            cols,
            left=left,
            right=right,
            kind=kind,
            all=not tree.args.get("distinct"),
        )
        # Hash in the set operation's exact result types: DuckDB casts each branch's values to them
        # (rounding to a FLOAT, or to a DECIMAL's scale) before it compares rows.
        types = tuple(self.node_types(rel))
        check_key_types(types)
        rel = replace(cast(SetOp, rel), key_types=types)
        keys = []
        hidden: dict[str, str] = {}  # column -> expression over the outputs, for ORDER BY only
        order = tree.args.get("order")
        for o in order.expressions if order else []:
            key = o.this
            if isinstance(key, exp.Literal) and key.is_int:
                name = cols[int(key.this) - 1]
            elif isinstance(key, exp.Column) and key.name in names:
                name = cols[names.index(key.name)]
            else:
                name = self.fresh("s")
                hidden[name] = to_sql(_over_outputs(key, names, cols))
            o = o.copy()
            o.set("this", col(name))
            keys.append(to_sql(o))
        if hidden:  # the sort keys as columns beside the outputs; the sort keeps only the outputs
            exprs = tuple(q(c) for c in cols) + tuple(hidden.values())
            rel = Project(cols + tuple(hidden), child=rel, exprs=exprs)
        return limited(rel, cols, keys, row_limit(tree, self), self)

    def by_name(self, tree: exp.SetOperation, left: Node, right: Node) -> tuple[Node, Node, list[str]]:
        """UNION [ALL] BY NAME: both sides projected onto every name (left's first, then the
        right's new ones; matched case-insensitively), NULL where a side lacks the column."""
        lnames = cast(exp.Query, unparen(tree.left)).named_selects
        rnames = cast(exp.Query, unparen(tree.right)).named_selects
        names = list(lnames) + [n for n in rnames if n.lower() not in {m.lower() for m in lnames}]

        def onto(side: Node, side_names: list[str]) -> Node:
            lower = [n.lower() for n in side_names]
            exprs = tuple(
                q(side.columns[lower.index(n.lower())]) if n.lower() in lower else "NULL" for n in names
            )
            return Project(tuple(self.fresh("o") for _ in names), child=side, exprs=exprs)

        return onto(left, lnames), onto(right, rnames), names


def _over_outputs(key: exp.Expr, names: list[str], cols: tuple[str, ...]) -> exp.Expr:
    """An ORDER BY expression of a set operation over its output columns, which are all it may
    read (DuckDB's binder checked that it reads nothing else)."""
    lower = [n.lower() for n in names]
    if any(isinstance(n, exp.Query | exp.Window | exp.AggFunc) for n in key.walk()):
        raise unsupported("ORDER BY of a set operation on a subquery, window or aggregate")
    for c in key.find_all(exp.Column):
        if c.table or lower.count(c.name.lower()) != 1:
            raise unsupported("ORDER BY of a set operation on an expression")

    def output(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Column):
            return col(cols[lower.index(n.name.lower())])
        return n

    return key.transform(output, copy=True)
