"""FROM and joins as plan nodes, each single-source conjunct pushed down to its source."""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from duckflock.catalog.partitioning import common_hash_type
from duckflock.plan.kinds import JoinKind
from duckflock.plan.nodes import FunctionScan, Join, Node, Scan, Values, referenced
from duckflock.sql.allowlist import unsupported
from duckflock.sql.ast_helpers import column_names, conjuncts, outer_aggregate, scope_find, to_sql
from duckflock.sql.build_base import BuilderBase, check_key_types
from duckflock.sql.functions import function_name
from duckflock.sql.subquery_columns import row_columns, stand_ins, value_root


class FromBuilder(BuilderBase):
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
        check_key_types([*ltypes, *rtypes])
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
