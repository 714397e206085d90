"""Build a logical plan from SQL.

sqlglot parses the text, qualifies every column, decorrelates subqueries into joins and pushes
predicates into join conditions; this module then maps the normalized SELECT tree onto plan nodes.
Columns get globally unique names ``alias.column`` so any subtree renders as plain nested SQL.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError, ParseError
from sqlglot.optimizer import RULES, optimize

from duckflock.catalog import Catalog
from duckflock.catalog.partitioning import canonical_hash_type, common_hash_type
from duckflock.catalog.partitioning import quote_ident as q
from duckflock.errors import SqlError
from duckflock.plan.nodes import (
    Aggregate,
    Distinct,
    Filter,
    FunctionScan,
    Join,
    Limit,
    Node,
    Project,
    Scan,
    SetOp,
    Sort,
    Values,
    Window,
)
from duckflock.sql.schema_db import SchemaDB
from duckflock.sql.semijoin import exists_to_semi_join

# sqlglot's rewrites that keep DuckDB semantics; its type annotation, canonicalization and
# simplification are left out because DuckDB, not sqlglot, decides types and constant folding.
# EXISTS subqueries become semi/anti joins (ours) before sqlglot's decorrelation sees them.
_KEPT = {
    "qualify",
    "pushdown_projections",
    "normalize",
    "unnest_subqueries",
    "pushdown_predicates",
    "optimize_joins",
    "eliminate_subqueries",
    "merge_subqueries",
    "eliminate_ctes",
    "quote_identifiers",
}
_RULES = tuple(
    r
    for rule in RULES
    if rule.__name__ in _KEPT
    for r in ((rule, exists_to_semi_join) if rule.__name__ == "qualify" else (rule,))
)


@dataclass(frozen=True)
class BoundQuery:
    plan: Node
    output_names: tuple[str, ...]  # the column names single-process DuckDB gives the result
    output_types: tuple[str, ...]
    arrow_schema: pa.Schema  # exactly what single-process DuckDB returns for this query


def bind(sql: str, catalog: Catalog, schema_db: SchemaDB) -> BoundQuery:
    text = sql.strip().rstrip(";")
    if not text:
        raise SqlError("empty query")
    try:
        statements = sqlglot.parse(text, read="duckdb")
    except ParseError as e:
        raise SqlError(f"cannot parse SQL: {e.errors[0]['description'] if e.errors else e}") from None
    if len(statements) != 1 or statements[0] is None:
        raise SqlError("expected exactly one SQL statement")
    tree = statements[0]
    if not isinstance(tree, exp.Query):
        raise SqlError(f"only SELECT queries are supported, not {tree.key.upper()}")
    described = schema_db.describe(text)  # DuckDB's binder: names the missing table or column
    schema = {n: {c: t for c, t in info.columns} for n, info in catalog.tables.items()}
    try:
        tree = optimize(tree, schema=schema, dialect="duckdb", rules=_RULES)
    except (OptimizeError, ValueError, KeyError) as e:
        raise SqlError(f"cannot plan this query: {e}") from None
    plan = _Builder(catalog, schema_db).query(tree, prefix=None)
    return BoundQuery(
        plan, tuple(n for n, _ in described), tuple(t for _, t in described), schema_db.arrow_schema(text)
    )


def _col(name: str) -> exp.Column:
    return exp.column(name, quoted=True)


def _sql(e: exp.Expression) -> str:
    return e.sql(dialect="duckdb")


def _unsupported(what: str) -> SqlError:
    return SqlError(f"unsupported SQL construct: {what}")


class _Builder:
    def __init__(self, catalog: Catalog, schema_db: SchemaDB):
        self.catalog = catalog
        self.schema_db = schema_db
        self.ctes: dict[str, exp.Expression] = {}
        self.subplans: dict[str, Node] = {}  # token -> plan of an uncorrelated subquery
        self._n = 0

    def fresh(self, stem: str) -> str:
        self._n += 1
        return f"__{stem}{self._n}"

    # ---- queries -----------------------------------------------------------------------------------
    def query(self, tree: exp.Expression, prefix: str | None) -> Node:
        """A SELECT (or set operation) as a node whose columns are named prefix.name (or fresh)."""
        with_ = tree.args.get("with_") or tree.args.get("with")
        if with_ is not None:
            if with_.args.get("recursive"):
                raise _unsupported("WITH RECURSIVE")
            for cte in with_.expressions:
                self.ctes[cte.alias_or_name] = cte.this
        if isinstance(tree, exp.SetOperation):
            return self.set_operation(tree, prefix)
        if not isinstance(tree, exp.Select):
            raise _unsupported(tree.key.upper())
        return self.select(tree, prefix)

    def select(self, s: exp.Select, prefix: str | None) -> Node:
        for bad, name in ((exp.Lateral, "LATERAL"), (exp.Unnest, "UNNEST")):
            if any(True for _ in _scope_find(s, bad)):
                raise _unsupported(name)
        for arg in ("qualify", "prewhere", "sample", "connect", "pivots"):
            if s.args.get(arg):
                raise _unsupported(arg.upper())
        rel = self.from_(s)

        selects = [self.names(e.copy()) for e in s.expressions]
        out_names = [e.alias_or_name for e in s.expressions]
        order = s.args.get("order")
        order_keys = [self.names(o.copy()) for o in order.expressions] if order else []
        if (
            len(order_keys) == 1
            and isinstance(order_keys[0].this, exp.Var)
            and order_keys[0].name.upper() == "ALL"
        ):
            # ORDER BY ALL: every output column, left to right, in the given direction.
            all_key = order_keys[0]
            order_keys = []
            for i in range(len(selects)):
                o = all_key.copy()
                o.set("this", exp.Literal.number(i + 1))
                order_keys.append(o)
        having = self.names(s.args["having"].this.copy()) if s.args.get("having") else None
        group = s.args.get("group")
        has_agg = any(_group_aggs(e) for e in [*selects, *order_keys, *([having] if having else [])])
        if group is not None or has_agg:
            if group is not None and (
                any(group.args.get(k) for k in ("rollup", "cube", "grouping_sets"))
                or any(isinstance(g, exp.Rollup | exp.Cube | exp.GroupingSets) for g in group.expressions)
            ):
                raise _unsupported("GROUPING SETS / ROLLUP / CUBE")
            if group is not None and group.args.get("all"):  # GROUP BY ALL: the non-aggregate outputs
                groups = [e.unalias().copy() for e in selects if not _group_aggs(e)]
            else:
                groups = [self.names(g.copy()) for g in (group.expressions if group else [])]
            rel, selects, order_keys, having = self.aggregate(
                rel,
                groups,
                selects,
                order_keys,
                having,
            )
            if having is not None:
                cond = _sql(having)
                rel = Filter(rel.columns, child=rel, condition=cond, subqueries=self.attach(cond))

        rel, selects, order_keys = self.windows(rel, selects, order_keys)

        # Output columns, plus hidden ones for ORDER BY keys that are not among them.
        names = [f"{prefix}.{n}" if prefix else self.fresh("o") for n in out_names]
        exprs = [_sql(e.unalias() if isinstance(e, exp.Alias) else e) for e in selects]
        sort_keys: list[str] = []
        for o in order_keys:
            key = o.this
            hit = None
            if isinstance(key, exp.Column) and not key.table and key.name in out_names:
                hit = names[out_names.index(key.name)]
            elif _sql(key) in exprs:
                hit = names[exprs.index(_sql(key))]
            elif isinstance(key, exp.Literal) and key.is_int:
                hit = names[int(key.this) - 1]
            if hit is None:
                if s.args.get("distinct"):
                    raise SqlError("for SELECT DISTINCT, ORDER BY expressions must appear in the select list")
                hit = self.fresh("s")
                names.append(hit)
                exprs.append(_sql(key))
            o = o.copy()
            o.set("this", _col(hit))
            sort_keys.append(_sql(o))
        rel = Project(tuple(names), child=rel, exprs=tuple(exprs), subqueries=self.attach(" ".join(exprs)))
        if s.args.get("distinct"):
            if s.args["distinct"].args.get("on"):
                raise _unsupported("DISTINCT ON")
            rel = Distinct(
                rel.columns, child=rel, key_types=self.hash_types(rel, [q(c) for c in rel.columns])
            )
        limit, offset = _int_arg(s, "limit"), _int_arg(s, "offset") or 0
        visible = tuple(names[: len(out_names)])
        if sort_keys:
            rel = Sort(visible, child=rel, keys=tuple(sort_keys), limit=limit, offset=offset)
        elif limit is not None or offset:
            rel = Limit(rel.columns, child=rel, limit=limit, offset=offset)
        return rel

    def aggregate(self, rel, groups, selects, order_keys, having):
        group_names: list[str] = []
        group_sql = [_sql(g) for g in groups]
        for g in groups:
            group_names.append(g.name if isinstance(g, exp.Column) else self.fresh("g"))
        aggs: dict[str, str] = {}  # agg SQL -> column name

        def replace(e: exp.Expression) -> exp.Expression:
            def fn(node: exp.Expression) -> exp.Expression:
                if isinstance(node, exp.AggFunc) and not _windowed(node):
                    key = _sql(node)
                    if key not in aggs:
                        aggs[key] = self.fresh("a")
                    return _col(aggs[key])
                if not isinstance(node, exp.Alias | exp.Ordered) and _sql(node) in group_sql:
                    return _col(group_names[group_sql.index(_sql(node))])
                return node

            return e.transform(fn, copy=True)

        selects = [replace(e) for e in selects]
        order_keys = [replace(o) for o in order_keys]
        having = replace(having) if having is not None else None
        node = Aggregate(
            tuple(group_names) + tuple(aggs.values()),
            child=rel,
            groups=tuple(group_sql),
            aggs=tuple(aggs),
            key_types=self.hash_types(rel, group_sql),
        )
        # Columns not grouped and not aggregated would be a binder error; DuckDB already checked.
        return node, selects, order_keys, having

    def hash_types(self, rel: Node, exprs: list[str]) -> tuple[str, ...]:
        """Canonical hash types of expressions over ``rel``: a shuffle on them then partitions rows
        the same way a catalog table or a join on those keys does, so later joins can reuse it."""
        return tuple(canonical_hash_type(t) for t in self.schema_db.node_types(rel, exprs)) if exprs else ()

    def windows(self, rel: Node, selects, order_keys):
        """Window functions become a Window node after grouping; expressions refer to its columns."""
        found: dict[str, str] = {}
        partitions: list[list[str]] = []

        def fn(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.Window):
                key = _sql(node)
                if key not in found:
                    found[key] = self.fresh("w")
                    partitions.append([_sql(p) for p in node.args.get("partition_by") or []])
                return _col(found[key])
            return node

        selects = [e.transform(fn, copy=True) for e in selects]
        order_keys = [o.transform(fn, copy=True) for o in order_keys]
        if not found:
            return rel, selects, order_keys
        common = [k for k in partitions[0] if all(k in p for p in partitions[1:])]
        node = Window(
            rel.columns + tuple(found.values()),
            child=rel,
            exprs=tuple(found),
            partition_keys=tuple(common),
            key_types=self.hash_types(rel, common),
        )
        return node, selects, order_keys

    def set_operation(self, tree: exp.SetOperation, prefix: str | None) -> Node:
        left = self.query(_unparen(tree.left), prefix=None)
        right = self.query(_unparen(tree.right), prefix=None)
        names = tree.named_selects
        if len(left.columns) != len(right.columns):
            raise SqlError(f"{tree.key.upper()} inputs have different numbers of columns")
        cols = tuple(f"{prefix}.{n}" if prefix else self.fresh("o") for n in names)
        kind = {exp.Union: "union", exp.Intersect: "intersect", exp.Except: "except"}[type(tree)]
        rel: Node = SetOp(
            cols,
            left=left,
            right=right,
            kind=kind,
            all=not tree.args.get("distinct"),
        )
        # Hash in the set operation's result types: that is how DuckDB compares its rows.
        result_types = self.schema_db.node_types(rel)
        rel = replace(rel, key_types=tuple(canonical_hash_type(t) for t in result_types))
        keys = []
        order = tree.args.get("order")
        for o in order.expressions if order else []:
            key = o.this
            if isinstance(key, exp.Literal) and key.is_int:
                name = cols[int(key.this) - 1]
            elif isinstance(key, exp.Column) and key.name in names:
                name = cols[names.index(key.name)]
            else:
                raise _unsupported("ORDER BY of a set operation on an expression")
            o = o.copy()
            o.set("this", _col(name))
            keys.append(_sql(o))
        limit, offset = _int_arg(tree, "limit"), _int_arg(tree, "offset") or 0
        if keys:
            rel = Sort(cols, child=rel, keys=tuple(keys), limit=limit, offset=offset)
        elif limit is not None or offset:
            rel = Limit(cols, child=rel, limit=limit, offset=offset)
        return rel

    # ---- FROM and joins ----------------------------------------------------------------------------
    def from_(self, s: exp.Select) -> Node:
        """FROM and JOINs with every single-source conjunct pushed down to its source.

        Filters must sit below the exchanges a join adds, so only needed rows cross the network.
        A conjunct is not pushed into a source whose rows an outer join may NULL-extend.
        """
        from_ = s.args.get("from_") or s.args.get("from")
        where = s.args.get("where")
        where_conj = _conjuncts(self.names(where.this.copy())) if where is not None else []
        if from_ is None:
            rel: Node = Values(("__one",))
            return self.filter(rel, where_conj)
        joins = s.args.get("joins") or []
        sources = [self.source(from_.this, s)] + [self.source(j.this, s) for j in joins]
        kinds = ["inner"] + [_join_kind(j) for j in joins]
        ons = [[]] + [_conjuncts(self.names(j.args["on"].copy())) if j.args.get("on") else [] for j in joins]
        nullable = [False] * len(sources)
        for i, kind in enumerate(kinds):
            if kind == "left":
                nullable[i] = True
            elif kind in ("right", "full"):
                nullable[: i + (kind == "full")] = [True] * (i + (kind == "full"))
        colsets = [set(src.columns) for src in sources]
        pushed: list[list[exp.Expression]] = [[] for _ in sources]

        def owner(c: exp.Expression, upto: int) -> int | None:
            used = _cols(c)
            for i in range(upto + 1):
                if used and used <= colsets[i] and not nullable[i]:
                    return i
            return None

        rest_where = []
        for c in where_conj:
            i = owner(c, len(sources) - 1)
            (pushed[i] if i is not None else rest_where).append(c)
        for j in range(1, len(sources)):
            keep = []
            for c in ons[j]:
                used = _cols(c)
                if used and used <= colsets[j] and kinds[j] in ("inner", "left", "semi", "anti"):
                    pushed[j].append(c)
                elif kinds[j] in ("inner", "semi") and (i := owner(c, j - 1)) is not None:
                    pushed[i].append(c)
                else:
                    keep.append(c)
            ons[j] = keep
        rel = self.filter(sources[0], pushed[0])
        for j in range(1, len(sources)):
            rel = self.join(rel, self.filter(sources[j], pushed[j]), kinds[j], ons[j])
        return self.filter(rel, rest_where)

    def filter(self, rel: Node, conj: list[exp.Expression]) -> Node:
        if not conj:
            return rel
        cond = _sql(exp.and_(*conj) if len(conj) > 1 else conj[0])
        return Filter(rel.columns, child=rel, condition=cond, subqueries=self.attach(cond))

    def source(self, item: exp.Expression, s: exp.Select) -> Node:
        alias = item.alias_or_name
        if isinstance(item, exp.Subquery):
            return self.query(item.this, prefix=alias)
        if not isinstance(item, exp.Table):
            raise _unsupported(f"{item.key.upper()} in FROM")
        if not isinstance(item.this, exp.Identifier):
            return self.function_scan(item)
        if item.name in self.ctes and not item.args.get("db"):
            return self.query(self.ctes[item.name].copy(), prefix=alias)
        info = self.catalog.table(item.name)
        used = []
        for c in _scope_find(s, exp.Column):
            if c.table == alias and c.name not in used:
                used.append(c.name)
        if not used:  # e.g. COUNT(*) over the table: still need its rows
            used = [info.columns[0][0]]
        return Scan(tuple(f"{alias}.{c}" for c in used), table=info.name, source_columns=tuple(used))

    def function_scan(self, item: exp.Table) -> Node:
        call = item.this.sql(dialect="duckdb")
        alias = item.args.get("alias")
        names = [c.name for c in alias.columns] if alias is not None and alias.columns else []
        described = [n for n, _ in self.schema_db.describe(f"SELECT * FROM {call}")]
        names = names + described[len(names) :]
        return FunctionScan(
            tuple(f"{item.alias_or_name}.{n}" for n in names), function=call, source_columns=tuple(names)
        )

    def join(self, left: Node, right: Node, jkind: str, on_conj: list[exp.Expression]) -> Node:
        cols = left.columns if jkind in ("semi", "anti") else left.columns + right.columns
        if jkind == "cross" or not on_conj:
            if jkind not in ("cross", "inner"):
                on_conj = [exp.true()]
            else:
                return Join(cols, left=left, right=right, kind="cross")
        on = exp.and_(*on_conj) if len(on_conj) > 1 else on_conj[0]
        lset, rset = set(left.columns), set(right.columns)
        lkeys, rkeys = [], []
        for conj in on_conj:
            if not isinstance(conj, exp.EQ):
                continue
            a, b = conj.this, conj.expression
            ca, cb = _cols(a), _cols(b)
            if ca and cb and ca <= lset and cb <= rset:
                lkeys.append(a)
                rkeys.append(b)
            elif ca and cb and ca <= rset and cb <= lset:
                lkeys.append(b)
                rkeys.append(a)
        ltypes = self.schema_db.node_types(left, [_sql(k) for k in lkeys]) if lkeys else []
        rtypes = self.schema_db.node_types(right, [_sql(k) for k in rkeys]) if rkeys else []
        return Join(
            cols,
            left=left,
            right=right,
            kind=jkind,
            left_keys=tuple(_sql(k) for k in lkeys),
            right_keys=tuple(_sql(k) for k in rkeys),
            left_key_cols=tuple(k.name if isinstance(k, exp.Column) else None for k in lkeys),
            right_key_cols=tuple(k.name if isinstance(k, exp.Column) else None for k in rkeys),
            key_types=tuple(common_hash_type(a, b) for a, b in zip(ltypes, rtypes, strict=True)),
            condition=_sql(on),
        )

    # ---- expressions --------------------------------------------------------------------------------
    def names(self, e: exp.Expression) -> exp.Expression:
        """Rewrite qualified columns ``t.c`` to the plan's unique column names ``"t.c"``, and plan each
        uncorrelated subquery separately, leaving a token table in its place."""

        def fn(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.Subquery | exp.Exists) and isinstance(node.this, exp.Query):
                return self.subquery(node)
            if isinstance(node, exp.Column) and node.table:
                return _col(f"{node.table}.{node.name}")
            return node

        return e.transform(fn, copy=False) if not isinstance(e, exp.Column) else fn(e)

    def subquery(self, node: exp.Subquery | exp.Exists) -> exp.Expression:
        body = node.this
        if _correlated(body):
            raise _unsupported("correlated subquery that could not be turned into a join")
        token = self.fresh("sq")
        self.subplans[token] = self.query(body.copy(), prefix=token)
        placeholder = exp.select("*").from_(exp.to_identifier(token, quoted=True))
        return type(node)(this=placeholder)

    def attach(self, sql: str) -> tuple[tuple[str, Node], ...]:
        """The subquery plans an expression's SQL refers to."""
        return tuple((tok, plan) for tok, plan in self.subplans.items() if q(tok) in sql)


def _join_kind(j: exp.Join) -> str:
    side = (j.args.get("side") or "").lower()
    kind = (j.args.get("kind") or "").lower()
    if j.args.get("using"):
        raise _unsupported("JOIN ... USING that could not be resolved")
    if kind in ("asof", "positional") or j.args.get("method"):
        raise _unsupported(f"{(kind or j.args.get('method')).upper()} JOIN")
    if kind in ("semi", "anti"):
        return kind
    if side in ("left", "right", "full"):
        return side
    return "inner" if j.args.get("on") is not None else "cross"


def _conjuncts(e: exp.Expression) -> list[exp.Expression]:
    """Split an AND tree (through parentheses), dropping literal TRUE left behind by rewrites."""
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.And):
        return _conjuncts(e.this) + _conjuncts(e.expression)
    if isinstance(e, exp.Boolean) and e.this is True:
        return []
    return [e]


def _windowed(node: exp.Expression) -> bool:
    """An aggregate used as a window function (SUM(x) OVER ...), not a GROUP BY aggregate."""
    return isinstance(node.parent, exp.Window) and node.parent.this is node


def _group_aggs(e: exp.Expression) -> list[exp.Expression]:
    return [a for a in e.find_all(exp.AggFunc) if not _windowed(a)]


def _unparen(e: exp.Expression) -> exp.Expression:
    while isinstance(e, exp.Subquery) and not e.alias:
        e = e.this
    return e


def _correlated(body: exp.Expression) -> bool:
    """Whether a subquery refers to a table alias it does not define itself."""
    defined = {t.alias_or_name for t in body.find_all(exp.Table)}
    defined |= {s.alias_or_name for s in body.find_all(exp.Subquery) if s.alias_or_name}
    defined |= {c.alias_or_name for c in body.find_all(exp.CTE)}
    return any(c.table and c.table not in defined for c in body.find_all(exp.Column))


def _cols(e: exp.Expression) -> set[str]:
    return {c.name for c in e.find_all(exp.Column)}


def _int_arg(s: exp.Expression, arg: str) -> int | None:
    node = s.args.get(arg)
    if node is None:
        return None
    value = node.args.get("expression") or node.this
    if not isinstance(value, exp.Literal) or not value.is_int:
        raise _unsupported(f"non-constant {arg.upper()}")
    return int(value.this)


def _scope_find(s: exp.Expression, kind: type):
    """Nodes of ``kind`` in this SELECT, not inside its WITH clause (CTE bodies are their own scopes)."""
    for key, value in s.args.items():
        if key in ("with_", "with"):
            continue
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, exp.Expression):
                yield from v.find_all(kind)
