"""Map a query in normal form (sql/passes.py) onto plan nodes, clause by clause.

Columns get globally unique names ``alias.column`` so any subtree renders as plain nested SQL; each
uncorrelated subquery is planned on its own and a token table stands for it in the expressions.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import cast

from sqlglot import exp

from duckflock.catalog import Catalog
from duckflock.catalog.partitioning import canonical_hash_type, check_spreadable, common_hash_type
from duckflock.errors import DuckflockError, SqlError
from duckflock.plan.kinds import JoinKind, SetOpKind
from duckflock.plan.nodes import (
    Aggregate,
    Distinct,
    Filter,
    FunctionScan,
    Join,
    Node,
    Project,
    Scan,
    SetOp,
    Values,
    Window,
    referenced,
)
from duckflock.sql.allowlist import check_supported, unsupported
from duckflock.sql.ast_helpers import (
    col,
    column_names,
    conjuncts,
    first_arg,
    outer_aggregate,
    outermost,
    parenthesized,
    scope_find,
    to_sql,
    unparen,
)
from duckflock.sql.functions import WRAPPERS, Aggregates, call_of, function_name, unit_of
from duckflock.sql.grouping_sets import item_sets, set_members, unparen_key
from duckflock.sql.row_limits import limited, row_limit
from duckflock.sql.schema_db import SchemaDB
from duckflock.sql.scopes import from_items, outer_columns, query_of
from duckflock.sql.subquery_columns import row_columns, stand_ins, value_root
from duckflock.sqltext import quote_ident as q

# The refusal of a rewritten query (or part of one) that DuckDB rejects, where it accepted the query.
REWRITE_REJECTED = "a rewrite DuckDB does not accept"


class Builder:
    def __init__(self, catalog: Catalog, schema_db: SchemaDB, aggregates: Aggregates):
        self.catalog = catalog
        self.schema_db = schema_db
        self.aggregates = aggregates
        # CTE name -> (body, the CTEs visible where it is defined): a nested WITH shadows an outer
        # name only inside its own query, and a body sees only the CTEs defined before it.
        self.ctes: dict[str, tuple[exp.Expr, dict]] = {}
        self.subplans: dict[str, Node] = {}  # token -> plan of a subquery
        self.correlated: set[str] = set()  # tokens of subqueries that refer to an outer row
        self._correlated_depth = 0  # > 0 while building a correlated subquery's plan
        # A subquery's text -> the token it was first planned as, and each token -> that one: the
        # same subquery written twice in one SELECT (GROUP BY 1 and its output) is one expression.
        self.first_of: dict[str, str] = {}
        self.same: dict[str, str] = {}
        self._n = 0

    def fresh(self, stem: str) -> str:
        self._n += 1
        return f"__{stem}{self._n}"

    # ---- queries -----------------------------------------------------------------------------------
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

    def precompute(self, rel: Node, roots: list[exp.Expr]) -> Node:
        """``rel`` with a column more for each expression of ``roots`` (a value of one row of
        ``rel``), which each root is replaced by (in the tree it is part of)."""
        if not roots:
            return rel
        names, exprs = list(rel.columns), [q(c) for c in rel.columns]
        for root in outermost(roots):
            if not row_columns(root) <= set(rel.columns):  # a lambda's parameter, an outer query's column
                raise unsupported("a subquery inside an expression over columns of another scope")
            sql = to_sql(root)
            if sql not in exprs:
                names.append(self.fresh("p"))
                exprs.append(sql)
            root.replace(col(names[exprs.index(sql)]))
        return Project(tuple(names), child=rel, exprs=tuple(exprs), **self.attach(" ".join(exprs)))

    def join_inputs(
        self, left: Node, right: Node, kind: JoinKind, on: list[exp.Expr]
    ) -> tuple[Node, Node, list[exp.Expr]]:
        """An outer, semi or anti join's sides with a column for each subquery its condition reads
        per pair of rows, computed on the side whose columns it reads (any, if none), and the
        condition over those columns. One that reads both sides is refused: unlike an inner join's,
        such a condition cannot move to a filter after the join."""
        sides = (set(left.columns), set(right.columns))
        holders = [exp.Paren(this=c) for c in on]
        roots: tuple[list[exp.Expr], list[exp.Expr]] = ([], [])
        for h in holders:
            for n in stand_ins(h, self.subplans):
                root = value_root(n)
                reads = row_columns(root) | {
                    c for t in self.tokens(root) if t in self.correlated for c in referenced(self.subplans[t])
                }
                reads &= sides[0] | sides[1]
                if reads <= sides[1]:
                    roots[1].append(root)
                elif reads <= sides[0]:
                    roots[0].append(root)
                else:
                    raise unsupported(
                        f"a subquery reading both sides of a {kind.upper()} JOIN's condition",
                        "a subquery reading both sides of an outer, semi or anti join's condition",
                    )
        return self.precompute(left, roots[0]), self.precompute(right, roots[1]), [h.this for h in holders]

    def matchable(self, e: exp.Expr) -> str:
        """``e``'s SQL with each subquery's token as the one its text was first planned as (and
        columns named by it so too): equal for the same expression written twice in a SELECT."""
        return _TOKEN.sub(lambda m: '"' + self.same.get(m.group(1), m.group(1)), to_sql(e))

    def tokens(self, e: exp.Expr) -> list[str]:
        """The tokens of the subqueries ``e`` holds."""
        sql = to_sql(e)
        return [t for t in self.subplans if q(t) in sql]

    def _is_unit(self, node: exp.Expr) -> bool:
        """An aggregate call with its wrappers, used for grouping (not as a window function, not
        inside a subquery's stand-in)."""
        if isinstance(node.parent, WRAPPERS) and node.parent.this is node:
            return False
        if query_of(node) is not None:  # the expression is a detached copy: any query is a stand-in
            return False
        if isinstance(node.parent, exp.Window) and node.parent.this is node:
            return False
        return self.aggregates.is_call(call_of(node))

    def node_types(self, rel: Node, exprs: list[str] | None = None) -> list[str]:
        """DuckDB types over ``rel``. Inside a correlated subquery a node may read outer columns,
        which no standalone query can bind; such nodes are evaluated inline (never shuffled), so
        their types are not needed: "" (unknown) then."""
        try:
            return self.schema_db.node_types(rel, exprs)
        except DuckflockError as e:
            # A subquery's token (its rows arrive as a table) where no plan feeds it: inside an
            # aggregate's argument, e.g. sum((SELECT max(b) FROM t)).
            if any(token in str(e) for token in self.subplans):
                raise unsupported("a subquery inside aggregate expressions") from None
            if not self._correlated_depth:
                raise unsupported(f"a rewrite DuckDB does not accept ({e})", REWRITE_REJECTED) from None
            return [""] * (len(exprs) if exprs is not None else len(rel.columns))

    def hash_types(self, rel: Node, exprs: list[str]) -> tuple[str, ...]:
        """Canonical hash types of expressions over ``rel``: a shuffle on them then partitions rows
        the same way a catalog table or a join on those keys does, so later joins can reuse it."""
        types = self.node_types(rel, exprs) if exprs else []
        _check_spreadable(types)
        return tuple(canonical_hash_type(t) for t in types)

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
        _check_spreadable(types)
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

    # ---- FROM and joins ----------------------------------------------------------------------------
    def from_(self, s: exp.Select) -> Node:
        """FROM and JOINs with every single-source conjunct pushed down to its source.

        Filters must sit below the exchanges a join adds, so only needed rows cross the network.
        A conjunct is not pushed into a source whose rows an outer join may NULL-extend.
        """
        from_ = s.args.get("from_") or s.args.get("from")
        where = s.args.get("where")
        where_conj = conjuncts(self.names(where.this.copy())) if where is not None else []
        if from_ is None:
            return self.filter(Values(("__one",)), where_conj)
        joins = s.args.get("joins") or []
        if isinstance(from_.this, exp.Lateral):
            raise unsupported("LATERAL as the first FROM item")
        sources = [self.source(from_.this, s)] + [self.source(j.this, s) for j in joins]
        lateral = [False] + [isinstance(j.this, exp.Lateral) for j in joins]
        kinds = [JoinKind.INNER] + [_join_kind(j) for j in joins]
        ons: list[list[exp.Expr]] = [[]]
        ons += [conjuncts(self.names(j.args["on"].copy())) if j.args.get("on") else [] for j in joins]
        pushed, rest_where = _push_down(sources, kinds, where_conj, ons, self.reads_outer_row)
        rel = self.filter(sources[0], pushed[0])
        for j in range(1, len(sources)):
            # An inner join's subquery (sqlglot's pushdown moves WHERE conjuncts into ON) filters
            # the joined rows: a join cannot evaluate it, a Filter can. Another join's is computed
            # on a side, as a column (``join_inputs``).
            right = self.filter(sources[j], pushed[j])
            inner = kinds[j] is JoinKind.INNER
            after = [c for c in ons[j] if inner and self.tokens(c)]
            on = [c for c in ons[j] if not any(c is a for a in after)]
            if not inner and not lateral[j] and any(self.tokens(c) for c in on):
                rel, right, on = self.join_inputs(rel, right, kinds[j], on)
            rel = self.join(rel, right, kinds[j], on, lateral[j])
            rel = self.filter(rel, after)
        return self.filter(rel, rest_where)

    def filter(self, rel: Node, conj: list[exp.Expr]) -> Node:
        if not conj:
            return rel
        cond = to_sql(exp.and_(*conj) if len(conj) > 1 else conj[0])
        return Filter(rel.columns, child=rel, condition=cond, **self.attach(cond))

    def source(self, item: exp.Expr, s: exp.Select) -> Node:
        alias = item.alias_or_name
        if isinstance(item, exp.Lateral):
            return self.lateral(item.this, alias)
        if isinstance(item, exp.Subquery):
            return self.query(item.this, prefix=alias)
        if isinstance(item, exp.Values):
            return self.values(item)
        if not isinstance(item, exp.Table):
            raise unsupported(f"{item.key.upper()} in FROM")
        if not isinstance(item.this, exp.Identifier):
            return self.function_scan(item)
        if item.name in self.ctes and not item.args.get("db"):
            body, visible = self.ctes[item.name]
            here, self.ctes = self.ctes, visible
            try:
                return self.query(body.copy(), prefix=alias)
            finally:
                self.ctes = here
        info = self.catalog.find(item.name)
        if info is None:  # DuckDB's binder took it: a file ('x.parquet' AS x) read by name
            raise unsupported(
                f"{item.name!r}, which is not a table of the catalog", "a FROM item not in the catalog"
            )
        used = []
        for c in scope_find(s, exp.Column):
            if c.table == alias and c.name not in used:
                used.append(c.name)
        if not used:  # e.g. COUNT(*) over the table: still need its rows
            used = [info.columns[0][0]]
        return Scan(tuple(f"{alias}.{c}" for c in used), table=info.name, source_columns=tuple(used))

    def lateral(self, sub: exp.Subquery, alias: str) -> Node:
        """A LATERAL subquery's plan: it may read the columns of the FROM items before it, which
        stay as they are for DuckDB to decorrelate where the join runs (see ``Join.lateral``)."""
        if outer_aggregate(sub.this, self.aggregates):
            raise unsupported("an aggregate of outer columns inside a LATERAL subquery")
        self._correlated_depth += 1
        try:
            return self.query(sub.this.copy(), prefix=alias)
        finally:
            self._correlated_depth -= 1

    def function_scan(self, item: exp.Table) -> Node:
        call = item.this.sql(dialect="duckdb")
        alias = item.args.get("alias")
        names = [c.name for c in alias.columns] if alias is not None and alias.columns else []
        described = [n for n, _ in self.schema_db.describe(f"SELECT * FROM {call}")]
        names = names + described[len(names) :]
        return FunctionScan(
            tuple(f"{item.alias_or_name}.{n}" for n in names), function=call, source_columns=tuple(names)
        )

    def values(self, item: exp.Values) -> Node:
        """VALUES in FROM: its rows, computed whole on every rank (sql/from_forms.py named its
        columns); each rank must compute the same rows."""
        if any(function_name(f) in self.schema_db.volatile_names for f in item.find_all(exp.Func)):
            raise unsupported("a volatile function in VALUES")
        names = [c.name for c in item.args["alias"].columns]
        rows = exp.Values(expressions=[e.copy() for e in item.expressions])
        return FunctionScan(
            tuple(f"{item.alias_or_name}.{n}" for n in names),
            function=f"({to_sql(rows)})",
            source_columns=tuple(names),
        )

    def join(
        self, left: Node, right: Node, jkind: JoinKind, on_conj: list[exp.Expr], lateral: bool = False
    ) -> Node:
        cols = left.columns + right.columns if jkind.keeps_right_columns else left.columns
        if lateral:
            if jkind not in (JoinKind.INNER, JoinKind.CROSS, JoinKind.LEFT):
                raise unsupported(f"{jkind.upper()} JOIN LATERAL")
            if jkind is JoinKind.CROSS or (jkind is JoinKind.INNER and not on_conj):
                return Join(cols, left=left, right=right, kind=JoinKind.CROSS, lateral=True)
            cond = to_sql(exp.and_(*on_conj)) if on_conj else "true"  # LEFT ... ON true keeps its rows
            return Join(cols, left=left, right=right, kind=jkind, condition=cond, lateral=True)
        if jkind is JoinKind.CROSS or not on_conj:
            if jkind not in (JoinKind.CROSS, JoinKind.INNER):
                on_conj = [exp.true()]
            else:
                return Join(cols, left=left, right=right, kind=JoinKind.CROSS)
        on = exp.and_(*on_conj) if len(on_conj) > 1 else on_conj[0]
        lset, rset = set(left.columns), set(right.columns)
        lkeys, rkeys = [], []
        for conj in on_conj:
            if not isinstance(conj, exp.EQ):
                continue
            a, b = conj.this, conj.expression
            ca, cb = column_names(a), column_names(b)
            if ca and cb and ca <= lset and cb <= rset:
                lkeys.append(a)
                rkeys.append(b)
            elif ca and cb and ca <= rset and cb <= lset:
                lkeys.append(b)
                rkeys.append(a)
        ltypes = self.node_types(left, [to_sql(k) for k in lkeys]) if lkeys else []
        rtypes = self.node_types(right, [to_sql(k) for k in rkeys]) if rkeys else []
        _check_spreadable([*ltypes, *rtypes])
        return Join(
            cols,
            left=left,
            right=right,
            kind=jkind,
            left_keys=tuple(to_sql(k) for k in lkeys),
            right_keys=tuple(to_sql(k) for k in rkeys),
            left_key_cols=tuple(k.name if isinstance(k, exp.Column) else None for k in lkeys),
            right_key_cols=tuple(k.name if isinstance(k, exp.Column) else None for k in rkeys),
            key_types=tuple(common_hash_type(a, b) for a, b in zip(ltypes, rtypes, strict=True)),
            condition=to_sql(on),
        )

    # ---- expressions --------------------------------------------------------------------------------
    def names(self, e: exp.Expr) -> exp.Expr:
        """Rewrite qualified columns ``t.c`` to the plan's unique column names ``"t.c"``, and plan each
        uncorrelated subquery separately, leaving a token table in its place."""

        def fn(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Subquery | exp.Exists) and isinstance(node.this, exp.Query):
                return self.subquery(node)
            if isinstance(node, exp.Column) and node.table:
                return col(f"{node.table}.{node.name}")
            return node

        return e.transform(fn, copy=False) if not isinstance(e, exp.Column) else fn(e)

    def subquery(self, node: exp.Subquery | exp.Exists) -> exp.Expr:
        """Plan a subquery on its own; a token stands for it in the expression. A correlated one
        (it reads a column of the outer row) is evaluated by DuckDB itself, inline, wherever the
        outer row is: the distribution pass gives it every rank's inputs whole (replicated)."""
        body = node.this
        token = self.fresh("sq")
        if outer_columns(body):
            if outer_aggregate(body, self.aggregates):
                raise unsupported("an aggregate of outer columns inside a subquery")
            self.correlated.add(token)
            self._correlated_depth += 1
        try:
            self.subplans[token] = self.query(body.copy(), prefix=token)
            self.first_of.setdefault(body.sql(dialect="duckdb"), token)
            self.same[token] = self.first_of[body.sql(dialect="duckdb")]
        finally:
            self._correlated_depth -= token in self.correlated
        placeholder = exp.select("*").from_(exp.to_identifier(token, quoted=True))
        columns = self.subplans[token].columns
        if isinstance(node, exp.Subquery) and len(columns) == 1 and self._one_row(body):
            # The same single value, as an aggregate: DuckDB (2.0) gets a correlated IN / NOT IN
            # wrong whose subquery reads a plain one-column scalar subquery (one outer row's NULL
            # reaches the others), and right where that scalar subquery aggregates.
            placeholder.set("expressions", [exp.func("any_value", col(columns[0]))])
        return type(node)(this=placeholder)

    def _one_row(self, body: exp.Expr) -> bool:
        """Whether a query gives at most one row: it aggregates without GROUP BY."""
        return (
            isinstance(body, exp.Select)
            and body.args.get("group") is None
            and any(self.aggregates.units(e) for e in body.expressions)
        )

    def reads_outer_row(self, e: exp.Expr) -> bool:
        """Whether ``e`` holds the token of a correlated subquery."""
        sql = e.sql(dialect="duckdb")
        return any(q(t) in sql for t in self.correlated)

    def attach(self, sql: str) -> dict:
        """The subquery plans an expression's SQL refers to, and which of them are correlated."""
        subs = tuple((tok, plan) for tok, plan in self.subplans.items() if q(tok) in sql)
        return {"subqueries": subs, "correlated": tuple(t for t, _ in subs if t in self.correlated)}


# A subquery's token at the start of a quoted name: "__sq3" or "__sq3.k".
_TOKEN = re.compile(r'"(__sq\d+)(?=[".])')


def _push_down(
    sources: list[Node],
    kinds: list[JoinKind],
    where_conj: list[exp.Expr],
    ons: list[list[exp.Expr]],
    pinned: Callable[[exp.Expr], bool],
) -> tuple[list[list[exp.Expr]], list[exp.Expr]]:
    """The conjuncts each source filters by itself, and the WHERE conjuncts left above the joins.
    ``ons`` (each join's ON conjuncts) keeps only those the join must evaluate. A ``pinned``
    conjunct (a correlated subquery: its outer columns are not in its text) stays where it is."""
    nullable = [False] * len(sources)
    for i, kind in enumerate(kinds):
        if kind.filters_right_after:
            nullable[i] = True
        if kind.filters_left_after:
            nullable[:i] = [True] * i
    colsets = [set(src.columns) for src in sources]
    pushed: list[list[exp.Expr]] = [[] for _ in sources]

    def owner(c: exp.Expr, upto: int) -> int | None:
        used = set() if pinned(c) else row_columns(c)
        for i in range(upto + 1):
            if used and used <= colsets[i] and not nullable[i]:
                return i
        return None

    rest_where: list[exp.Expr] = []
    for c in where_conj:
        at = owner(c, len(sources) - 1)
        (pushed[at] if at is not None else rest_where).append(c)
    for j in range(1, len(sources)):
        keep = []
        for c in ons[j]:
            used = set() if pinned(c) else row_columns(c)
            if used and used <= colsets[j] and kinds[j] in _ON_PUSHED_RIGHT:
                pushed[j].append(c)
            elif kinds[j] in _ON_PUSHED_LEFT and (at := owner(c, j - 1)) is not None:
                pushed[at].append(c)
            else:
                keep.append(c)
        ons[j] = keep
    return pushed, rest_where


# Joins whose ON conjunct over one side alone filters that side's rows before the join.
_ON_PUSHED_RIGHT = (JoinKind.INNER, JoinKind.LEFT, JoinKind.SEMI, JoinKind.ANTI)
_ON_PUSHED_LEFT = (JoinKind.INNER, JoinKind.SEMI)


def _check_spreadable(types: Iterable[str]) -> None:
    """Refuse keys of types rows must not be hashed or ranged by (catalog/partitioning.py)."""
    try:
        for t in types:
            check_spreadable(t)
    except ValueError as e:
        raise unsupported(str(e), "keys, groups or set operations over VARIANT or GEOMETRY values") from None


def _join_kind(j: exp.Join) -> JoinKind:
    side = (j.args.get("side") or "").lower()
    kind = (j.args.get("kind") or "").lower()
    if j.args.get("using"):
        raise unsupported("JOIN ... USING that could not be resolved")
    if (j.args.get("method") or "").upper() == "ASOF":
        return JoinKind.ASOF_LEFT if side == "left" else JoinKind.ASOF
    if kind in ("asof", "positional") or j.args.get("method"):
        raise unsupported(f"{(kind or str(j.args.get('method'))).upper()} JOIN")
    if kind in ("semi", "anti"):
        return JoinKind(kind)
    if side in ("left", "right", "full"):
        return JoinKind(side)
    return JoinKind.INNER if j.args.get("on") is not None else JoinKind.CROSS


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
