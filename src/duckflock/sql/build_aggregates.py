"""GROUP BY, aggregates (grouping sets, aggregates of an outer query's rows) and window functions
as plan nodes."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from sqlglot import exp

from duckflock.plan.nodes import Aggregate, Node, Window
from duckflock.sql.allowlist import unsupported
from duckflock.sql.ast_helpers import col, first_arg, to_sql
from duckflock.sql.build_base import BuilderBase
from duckflock.sql.functions import call_of, unit_of
from duckflock.sql.grouping_sets import item_sets, set_members, unparen_key
from duckflock.sql.scopes import from_items, outer_columns, query_of
from duckflock.sql.subquery_columns import stand_ins, value_root


class AggregateBuilder(BuilderBase):
    def group_keys(
        self, group: exp.Group | None, selects: list[exp.Expr], scoped: list[exp.Expr]
    ) -> tuple[list[exp.Expr], tuple[tuple[int, ...], ...] | None]:
        """The group expressions and, for GROUPING SETS / ROLLUP / CUBE, the sets over them."""
        if group is None:
            return [], None
        if any(isinstance(g, exp.Rollup | exp.Cube | exp.GroupingSets) for g in group.expressions):
            return self.grouping_sets(group)
        if group.args.get("all"):  # GROUP BY ALL: the non-aggregate outputs that read the rows
            return [e.unalias().copy() for e in selects if not self.aggregates.units(e)], None
        return [self.names(m.copy()) for g in group.expressions for m in set_members(g)], None

    def grouping_sets(self, group: exp.Group) -> tuple[list[exp.Expr], tuple[tuple[int, ...], ...]]:
        """Every group expression once, and each grouping set as indices into them: ROLLUP and
        CUBE written out, several items combined as their cross product (as SQL defines it)."""
        items = [item_sets(g) for g in group.expressions]
        groups: list[exp.Expr] = []
        keys: list[str] = []
        sets = []
        for combo in itertools.product(*items):
            members = []
            for e in (e for part in combo for e in part):
                named = self.names(e.copy())
                if to_sql(named) not in keys:
                    keys.append(to_sql(named))
                    groups.append(named)
                if keys.index(to_sql(named)) not in members:
                    members.append(keys.index(to_sql(named)))
            sets.append(tuple(members))
        return groups, tuple(sets)

    def aggregate(
        self,
        rel: Node,
        groups: list[exp.Expr],
        selects: list[exp.Expr],
        order_keys: list[exp.Expr],
        having: exp.Expr | None,
        qualify_: exp.Expr | None,
        sets: tuple[tuple[int, ...], ...] | None = None,
        lifted: Sequence[tuple[exp.Expr, str]] = (),
    ) -> tuple[Node, list[exp.Expr], list[exp.Expr], exp.Expr | None, exp.Expr | None]:
        group_names: list[str] = []
        group_sql = [self.matchable(g) for g in groups]  # how the expressions above name the groups
        rel, groups = self.aggregate_inputs(rel, groups, [*selects, *order_keys, having, qualify_])
        for g in groups:
            group_names.append(g.name if isinstance(g, exp.Column) else self.fresh("g"))
        aggs: dict[str, str] = {to_sql(u): name for u, name in lifted}  # agg SQL -> column name
        # agg SQL -> SQL of its first argument
        args: dict[str, str | None] = {to_sql(u): first_arg(call_of(u)) for u, _ in lifted}

        def replace(e: exp.Expr) -> exp.Expr:
            def fn(node: exp.Expr) -> exp.Expr:
                if isinstance(node, exp.Grouping | exp.GroupingId) and query_of(node) is None:
                    return self._grouping(node, group_sql, sets is not None, aggs, args)
                if self._is_unit(node):
                    key = to_sql(node)
                    if key not in aggs:
                        aggs[key] = self.fresh("a")
                        args[key] = first_arg(call_of(node))
                    return col(aggs[key])
                if not isinstance(node, exp.Alias | exp.Ordered) and self.matchable(node) in group_sql:
                    return col(group_names[group_sql.index(self.matchable(node))])
                return node

            return e.transform(fn, copy=True)

        selects = [replace(e) for e in selects]
        order_keys = [replace(o) for o in order_keys]
        having = replace(having) if having is not None else None
        qualify_ = replace(qualify_) if qualify_ is not None else None
        if not aggs and not groups:  # a row per grouping set needs a column: a COUNT(*) nobody reads
            if sets is not None and len(sets) > 1:  # DuckDB gives one row for GROUPING SETS ((), ())
                raise unsupported("GROUPING SETS of no columns without an aggregate")
            aggs[to_sql(exp.Count(this=exp.Star()))] = self.fresh("a")
            args[next(iter(aggs))] = None
        with_arg = [a for a in args.values() if a is not None]
        types = iter(self.node_types(rel, with_arg) if with_arg else [])
        node = Aggregate(
            tuple(group_names) + tuple(aggs.values()),
            child=rel,
            groups=tuple(to_sql(g) for g in groups),
            aggs=tuple(aggs),
            key_types=self.hash_types(rel, [to_sql(g) for g in groups]),
            grouping_sets=sets,
            arg_types=tuple(next(types) if a is not None else "" for a in args.values()),
        )
        # Columns not grouped and not aggregated would be a binder error; DuckDB already checked.
        return node, selects, order_keys, having, qualify_

    def _grouping(
        self,
        node: exp.Expr,
        group_sql: list[str],
        sets: bool,
        aggs: dict[str, str],
        args: dict[str, str | None],
    ) -> exp.Expr:
        """GROUPING(k, ...) as a column of the aggregate (a bit per key, set in the rows of the
        grouping sets without it); without grouping sets every key is in the one set: 0."""
        keys = [to_sql(unparen_key(a)) for a in node.expressions]
        if any(k not in group_sql for k in keys):
            raise unsupported("GROUPING() of an expression not grouped by as written")
        if not sets:
            return exp.cast(exp.Literal.number(0), exp.DataType.build("BIGINT"))
        key = f"GROUPING({', '.join(keys)})"
        if key not in aggs:
            aggs[key] = self.fresh("a")
            args[key] = None
        return col(aggs[key])

    def lift_outer_aggregates(self, s: exp.Select) -> tuple[exp.Select, list[tuple[exp.Expr, str]]]:
        """An aggregate inside a subquery of this SELECT's outputs, HAVING, ORDER BY or QUALIFY
        whose columns all belong to this SELECT's FROM aggregates this SELECT's rows (SQL's rule):
        ``s`` with each such aggregate as an outer column of the subquery (``"__lift.__l3"``), and
        the aggregates (over plan names) with their columns, for this SELECT's Aggregate to give."""
        own = set(from_items(s))

        def nested(s: exp.Select) -> list[exp.Expr]:  # aggregate calls inside its subqueries
            parts = [*s.expressions, *(s.args.get(a) for a in ("having", "order", "qualify"))]
            return [
                n
                for part in parts
                if part is not None
                for n in part.find_all(exp.Func)
                if self.aggregates.is_call(n) and query_of(n) is not s
            ]

        if not nested(s):
            return s, []
        s = s.copy()
        lifted: list[tuple[exp.Expr, str]] = []
        for node in nested(s):
            unit = unit_of(node)
            if isinstance(unit.parent, exp.Window) and unit.parent.this is unit:
                continue
            top: exp.Expr | None = None
            p: exp.Expr | None = unit
            while p is not None and p is not s:
                top = p if isinstance(p, exp.Query) else top
                p = p.parent
            cols = list(unit.find_all(exp.Column))
            if top is None or not cols or any(True for _ in unit.find_all(exp.Query)):
                continue
            outer = outer_columns(top, within=unit)
            if len(outer) != len(cols) or any(c.table not in own for c in cols):
                continue  # reads the subquery's own rows (or another scope's): its aggregate
            if s.args.get("group") is not None and s.args["group"].args.get("all"):
                raise unsupported("an aggregate of outer columns inside a subquery, with GROUP BY ALL")
            name = self.fresh("l")
            lifted.append((self.names(unit.copy()), f"__lift.{name}"))
            unit.replace(exp.column(name, table="__lift", quoted=True))
        return s, lifted

    def aggregate_inputs(
        self, rel: Node, groups: list[exp.Expr], exprs: list[exp.Expr | None]
    ) -> tuple[Node, list[exp.Expr]]:
        """``rel`` with a column for each subquery the aggregate reads per row (in an aggregate's
        arguments or FILTER, in ``exprs``, which are rewritten to read it; or in a group key), and
        the group keys over it (sql/subquery_columns.py)."""
        roots = [
            value_root(n)
            for e in exprs
            if e is not None
            for unit in [u for u in e.walk() if self._is_unit(u)]
            for n in stand_ins(unit, self.subplans)
        ]
        holders = [exp.Paren(this=g.copy()) for g in groups]
        roots += [h.this for h in holders if stand_ins(h.this, self.subplans)]
        rel = self.precompute(rel, roots)
        return rel, [h.this for h in holders]

    def windows(self, rel: Node, selects, order_keys, qualify_):
        """Window functions become a Window node after grouping; expressions refer to its columns."""
        found: dict[str, str] = {}
        partitions: list[list[str]] = []
        # A subquery inside a window function (its arguments, PARTITION BY, ORDER BY) is read per
        # row: a column of the rows below, as an aggregate's (``precompute``).
        scoped = [e for e in (*selects, *order_keys, qualify_) if e is not None]
        windowed = [n for e in scoped for w in e.find_all(exp.Window) for n in stand_ins(w, self.subplans)]
        rel = self.precompute(rel, [value_root(n) for n in windowed])

        def fn(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Window):
                key = to_sql(node)
                if key not in found:
                    found[key] = self.fresh("w")
                    partitions.append([to_sql(p) for p in node.args.get("partition_by") or []])
                return col(found[key])
            return node

        selects = [e.transform(fn, copy=True) for e in selects]
        order_keys = [o.transform(fn, copy=True) for o in order_keys]
        qualify_ = qualify_.transform(fn, copy=True) if qualify_ is not None else None
        if not found:
            return rel, selects, order_keys, qualify_
        common = [k for k in partitions[0] if all(k in p for p in partitions[1:])]
        node = Window(
            rel.columns + tuple(found.values()),
            child=rel,
            exprs=tuple(found),
            partition_keys=tuple(common),
            key_types=self.hash_types(rel, common),
        )
        return node, selects, order_keys, qualify_
