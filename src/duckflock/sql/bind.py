"""Build a logical plan from SQL.

sqlglot parses the text, qualifies every column, decorrelates subqueries into joins and pushes
predicates into join conditions; this module then maps the normalized SELECT tree onto plan nodes.
Columns get globally unique names ``alias.column`` so any subtree renders as plain nested SQL.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import cast

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel, ParseError, SqlglotError
from sqlglot.optimizer import RULES, optimize
from sqlglot.optimizer.optimizer import OptimizerFn
from sqlglot.optimizer.qualify import qualify

from duckflock.catalog import Catalog
from duckflock.catalog.partitioning import canonical_hash_type, check_spreadable, common_hash_type
from duckflock.errors import CatalogError, DuckflockError, NotDistributed, SqlError, duckdb_message
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
    WithSubqueries,
    own_sql,
    referenced,
    walk,
)
from duckflock.plan.render import render
from duckflock.sql.allowlist import check_supported, unsupported
from duckflock.sql.asof_forms import asof_semi_anti_as_plain, asof_using_as_inequality, mark_asof_using
from duckflock.sql.decorrelate import scalar_subqueries_to_joins
from duckflock.sql.derived_names import unique_derived_names
from duckflock.sql.describe import is_schema_question, schema_answer
from duckflock.sql.distinct_on import distinct_on_as_qualify
from duckflock.sql.driver_fallback import on_driver
from duckflock.sql.from_forms import rewrite_from_forms
from duckflock.sql.functions import WRAPPERS, Aggregates, call_of, function_name, unit_of
from duckflock.sql.grouping_sets import item_sets, set_members, unparen_key
from duckflock.sql.join_groups import flatten_join_groups, groups_as_derived_tables
from duckflock.sql.join_order import optimize_joins
from duckflock.sql.order_all import order_by_all_written_out
from duckflock.sql.positions import plain_positions
from duckflock.sql.pushdown import pushdown_predicates
from duckflock.sql.query_constants import check_introspection, check_introspection_text, fix_clock
from duckflock.sql.rewrite_hazards import rules_to_skip
from duckflock.sql.round_trip import check_round_trip
from duckflock.sql.row_limits import limited, row_limit
from duckflock.sql.schema_db import SchemaDB
from duckflock.sql.scopes import from_items, outer_columns, query_of
from duckflock.sql.semijoin import exists_to_semi_join
from duckflock.sql.shadowing import order_by_input_columns, unshadow_nested_sources, unshadow_semi_join_sides
from duckflock.sql.subquery_columns import row_columns, stand_ins, value_root
from duckflock.sql.using_joins import check_using_joins
from duckflock.sqltext import quote_ident as q

# sqlglot's rewrites that keep DuckDB semantics; its type annotation, canonicalization and
# simplification (also the one pushdown_predicates runs: sql/pushdown.py) are left out because
# DuckDB, not sqlglot, decides types and constant folding.
# sqlglot's subquery unnesting is left out too: it turns IN / ANY / correlated subqueries into
# joins that lose their NULL and empty-set semantics. Ours rewrite only the shapes that are exact
# (EXISTS -> semi/anti join, a NULL-strict correlated scalar in WHERE -> join on grouped keys);
# every other subquery is evaluated by DuckDB itself (see plan/distribute.py).
# merge_subqueries and eliminate_subqueries are left out as well: inlining a derived table or CTE
# changed answers (an outer join's NULL-extended computed columns, volatile calls copied, GROUP BY
# of an inlined constant), and hoisting a derived table to a CTE moved a correlated one out of the
# subquery it reads from. Neither changes a TPC-H plan's joins, exchanges or stages.
_KEPT = {
    "pushdown_projections",
    "normalize",
    "pushdown_predicates",
    "optimize_joins",
    "eliminate_ctes",
    "quote_identifiers",
}
# sqlglot's rules we run in a version of our own (sql/join_order.py, sql/pushdown.py).
_OURS: dict[str, OptimizerFn] = {"optimize_joins": optimize_joins, "pushdown_predicates": pushdown_predicates}
_RULES: tuple[OptimizerFn, ...] = (
    qualify,
    asof_using_as_inequality,
    groups_as_derived_tables,
    order_by_all_written_out,
    order_by_input_columns,
    exists_to_semi_join,
    scalar_subqueries_to_joins,
    *(
        _OURS.get(getattr(rule, "__name__", ""), rule)
        for rule in RULES
        if getattr(rule, "__name__", "") in _KEPT
    ),
)


# The refusal of a rewritten query (or part of one) that DuckDB rejects, where it accepted the query.
REWRITE_REJECTED = "a rewrite DuckDB does not accept"


@dataclass(frozen=True)
class BoundQuery:
    plan: Node
    output_names: tuple[str, ...]  # the column names single-process DuckDB gives the result
    output_types: tuple[str, ...]
    arrow_schema: pa.Schema  # exactly what single-process DuckDB returns for this query

    @classmethod
    def of(cls, plan: Node, text: str, described: list[tuple[str, str]], schema_db: SchemaDB) -> BoundQuery:
        """``plan`` for the query ``text``, whose result DuckDB described so."""
        names, types = tuple(n for n, _ in described), tuple(t for _, t in described)
        return cls(plan, names, types, schema_db.arrow_schema(text))


def bind(sql: str, catalog: Catalog, schema_db: SchemaDB, driver_fallback_bytes: int = 0) -> BoundQuery:
    """The query's plan. DuckDB must accept the query; what duckflock cannot distribute runs on
    the driver when its tables total at most ``driver_fallback_bytes``, else it is refused."""
    text = sql.strip().rstrip(";")
    if not text:
        raise SqlError("empty query")
    try:  # DuckDB's parser is the authority on what is SQL: a syntax error is told in its words
        parsed = schema_db.con.extract_statements(text)
    except duckdb.Error as e:
        raise SqlError(duckdb_message(e)) from None
    try:
        with _quiet_sqlglot():  # it logs a warning for statements it keeps as raw commands
            statements = sqlglot.parse(text, read="duckdb")
    except SqlglotError as e:  # ParseError, or TokenError
        # DuckDB accepts it (ROLLUP(x IS NULL)): say whose parser gave up, and let the driver
        # answer it as written.
        reason = f"cannot parse SQL (duckflock's SQL parser, sqlglot, cannot read it{_where(e)})"
        refusal = NotDistributed(reason, "SQL that sqlglot cannot parse")
        return _unparsed(text, parsed, catalog, schema_db, refusal, driver_fallback_bytes)
    # Empty statements (";SELECT 1"), and a comment after the last one (a Semicolon to sqlglot).
    found = [s for s in statements if s is not None and not isinstance(s, exp.Semicolon)]
    if len(found) != 1:
        raise SqlError("expected exactly one SQL statement")
    tree = found[0]
    if isinstance(tree, exp.Pivot):  # a PIVOT / UNPIVOT statement: a query, run as one
        text = f"SELECT * FROM ({text})"
        tree = sqlglot.parse_one(text, read="duckdb")
    if is_schema_question(tree, catalog):
        described = schema_db.describe(text)
        return BoundQuery.of(schema_answer(text, schema_db, described), text, described, schema_db)
    if not isinstance(tree, exp.Query):
        what = tree.key.upper()
        if isinstance(tree, exp.Command):  # what sqlglot keeps as raw text: SHOW databases
            what = f"{tree.name} {str(tree.expression).strip()}"
        raise SqlError(f"only SELECT, DESCRIBE and SHOW TABLES are supported, not {what}")
    for pivot in tree.find_all(exp.Pivot):
        simple = pivot.args.get("this") is not None and not pivot.args.get("unpivot")  # PIVOT t ON ...
        if simple and not all(isinstance(on, exp.In) for on in pivot.expressions):
            # A plan's result columns are known before it runs; these come from the values.
            raise SqlError(
                "PIVOT ... ON a column without IN (...): its columns depend on the data; list the values"
            )
    check_introspection(tree, catalog.tables)
    described = schema_db.describe(text)  # DuckDB's binder: names the missing table or column
    try:
        plan = _distributed(text, tree, catalog, schema_db)
        _check_plan(plan, described, schema_db)
    except NotDistributed as e:  # DuckDB accepts it, duckflock cannot distribute it (yet)
        plan = on_driver(text, catalog, len(described), e, driver_fallback_bytes)
    return BoundQuery.of(plan, text, described, schema_db)


def _check_struct_names(tree: exp.Expr, catalog: Catalog) -> None:
    """A STRUCT column named like a FROM item of the query: DuckDB reads ``s.t.a`` (and, inside a
    subquery over ``s``, even ``t.a``) as a field of the column, the rewrite as the item's column."""
    items = {n.alias_or_name.lower() for n in tree.find_all(exp.Table, exp.Subquery, exp.CTE)}
    for table in tree.find_all(exp.Table):
        info = catalog.find(table.name) if isinstance(table.this, exp.Identifier) else None
        for column, typ in info.columns if info is not None else ():
            if typ.upper().startswith("STRUCT") and column.lower() in items:
                raise unsupported(
                    f"a STRUCT column ({column}) named like a FROM item",
                    "a STRUCT column named like a FROM item",
                )


def _parenthesized(e: exp.Expr) -> exp.Expr:
    """``e`` as an operand: in parentheses unless it is one token or a call (sqlglot's AND, OR and
    operators such as POW are calls to it too: they get them)."""
    operator = isinstance(e, exp.Binary | exp.Connector | exp.Unary)
    atomic = isinstance(e, exp.Column | exp.Literal | exp.Paren) or (isinstance(e, exp.Func) and not operator)
    return e if atomic else exp.Paren(this=e)


# sqlglot's own classes, as its messages name them ("... missing for <class 'sqlglot...Where'>").
_SQLGLOT_CLASS = re.compile(r"\s*(for )?<class 'sqlglot\.[^']*'>")


def _where(e: SqlglotError) -> str:
    """Where sqlglot's parser stopped, for the user: not its own wording, which names its classes
    ("Required keyword: 'expression' missing for <class 'sqlglot.expressions.core.Mul'>")."""
    errors = e.errors if isinstance(e, ParseError) else []
    if not errors or not errors[0].get("highlight"):
        return ""
    error = errors[0]
    return f' at "{error["highlight"]}", line {error["line"]}'


def _unparsed(
    text: str,
    statements: list[duckdb.Statement],
    catalog: Catalog,
    schema_db: SchemaDB,
    refusal: NotDistributed,
    limit_bytes: int,
) -> BoundQuery:
    """A query sqlglot cannot parse, answered by DuckDB on the driver where DuckDB's own parser
    found (``statements``) one SELECT that passes the introspection checks (by name, there being
    no tree), else ``refusal``."""
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        raise refusal
    check_introspection_text(text)
    described = schema_db.describe(text)
    plan = on_driver(text, catalog, len(described), refusal, limit_bytes)
    return BoundQuery.of(plan, text, described, schema_db)


@contextmanager
def _quiet_sqlglot() -> Iterator[None]:
    log = logging.getLogger("sqlglot")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _check_plan(plan: Node, described: list[tuple[str, str]], schema_db: SchemaDB) -> None:
    """The plan, read as one query over the tables, must bind in DuckDB to the types DuckDB gives
    the query itself: a rewrite that DuckDB rejects would fail on the ranks with a message about
    names the user never wrote, and one that changes a column's type answers in the wrong type."""
    try:
        got = [t for _, t in schema_db.describe(render(plan, lambda scan: q(scan.table)))]
    except (SqlError, CatalogError) as e:
        raise unsupported(
            f"a rewrite DuckDB does not accept ({e})", "a rewrite DuckDB does not accept"
        ) from None
    want = [t for _, t in described]
    if got != want:
        types = f"{', '.join(got)} for {', '.join(want)}"
        raise unsupported(
            f"a rewrite that changes the result's types ({types})",
            "a rewrite that changes the result's types",
        )


def _distributed(text: str, tree: exp.Expr, catalog: Catalog, schema_db: SchemaDB) -> Node:
    check_round_trip(schema_db.con, schema_db.function_aliases, text, tree, schema_db.type_aliases)
    tree = fix_clock(tree, schema_db)
    tree = distinct_on_as_qualify(plain_positions(tree))
    tree = flatten_join_groups(tree, schema_db)
    tree = rewrite_from_forms(tree, schema_db)
    tree = asof_semi_anti_as_plain(mark_asof_using(tree))
    check_supported(tree)
    _check_struct_names(tree, catalog)
    aggregates = Aggregates(schema_db.aggregate_names)
    schema = {n: {c: t for c, t in info.columns} for n, info in catalog.tables.items()}
    tree = unique_derived_names(tree, schema)
    check_using_joins(tree, schema_db)
    try:
        tree = _normalize(tree, aggregates)
        tree = unshadow_nested_sources(tree)
        skip = rules_to_skip(tree, schema_db.volatile_names, schema_db.describe)
        rules = tuple(r for r in _RULES if getattr(r, "__name__", "") not in skip)
        # isolate_tables (optimize's default) wraps each joined table in a derived table for
        # merge_subqueries to merge back; without that rule it would leave them there.
        tree = optimize(
            tree,
            schema=cast(dict, schema),
            dialect="duckdb",
            rules=rules,
            table_types=schema,
            isolate_tables=False,
        )
        builder = _Builder(catalog, schema_db, aggregates)
        plan = builder.query(tree, prefix=None)
    except SqlglotError as e:
        # sqlglot's rewrites raise these on queries they do not understand: refuse, never guess.
        # The user reads this (explain, a refusal): sqlglot's name for its error or classes say
        # nothing. Any other exception is a bug, raised as it is (plan/planner.py names it so).
        why = _SQLGLOT_CLASS.sub("", str(e))
        raise NotDistributed(
            f"cannot plan this query: {why}", f"a query sqlglot's rewrites reject ({type(e).__name__})"
        ) from None
    # Only Filter and Project carry subquery plans; a token anywhere else has no rows behind it.
    tokens = [q(t) for t in builder.subplans]
    for node in walk(plan):
        if not isinstance(node, WithSubqueries) and any(t in sql for sql in own_sql(node) for t in tokens):
            raise unsupported(f"a subquery inside {type(node).__name__.lower()} expressions")
    return plan


def _normalize(tree: exp.Expr, aggregates: Aggregates) -> exp.Expr:
    """Rewrite what sqlglot's rules and the builder would misread, keeping DuckDB's meaning:
    DuckDB aggregates sqlglot does not know become aggregate nodes (so no rule moves them as if
    scalar); named windows are written out; ORDER BY * is ORDER BY ALL; ANY / ALL get a subquery;
    a SEMI / ANTI join's right side gets a name no column shadows (sql/shadowing.py)."""
    for call in list(tree.find_all(exp.Anonymous)):
        if aggregates.is_call(call):
            call.replace(exp.AnonymousAggFunc(this=call.this, expressions=call.expressions))
    for select in list(tree.find_all(exp.Select)):
        _expand_named_windows(select)
    for ordered in list(tree.find_all(exp.Ordered)):
        if isinstance(ordered.this, exp.Star):
            ordered.set("this", exp.var("ALL"))
    for node in list(tree.find_all(exp.Any, exp.All)):
        if isinstance(node.this, exp.Query):
            node.set("this", exp.Subquery(this=node.this))
    return unshadow_semi_join_sides(tree)


def _expand_named_windows(select: exp.Select) -> None:
    """``OVER w ... WINDOW w AS (...)``: copy each definition into the windows that name it."""
    defs: dict[str, exp.Window] = {}
    for w in select.args.get("windows") or []:
        _inherit(w, defs)
        defs[w.name.lower()] = w
    select.set("windows", None)
    for w in select.find_all(exp.Window):
        if query_of(w) is select:
            _inherit(w, defs)


def _inherit(w: exp.Window, defs: dict[str, exp.Window]) -> None:
    alias = w.args.get("alias")
    if alias is None or alias.name.lower() not in defs:
        return
    base = defs[alias.name.lower()]
    for arg in ("partition_by", "order", "spec"):
        if base.args.get(arg) and not w.args.get(arg):
            value = base.args[arg]
            w.set(arg, [v.copy() for v in value] if isinstance(value, list) else value.copy())
    w.set("alias", None)


def _col(name: str) -> exp.Column:
    return exp.column(name, quoted=True)


def _sql(e: exp.Expr) -> str:
    # Raise, rather than write SQL that means something else, where sqlglot cannot render a node.
    return e.sql(dialect="duckdb", unsupported_level=ErrorLevel.RAISE)


class _Builder:
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
        exprs = [_sql(e.unalias() if isinstance(e, exp.Alias) else e) for e in selects]
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
                    _parenthesized(aliases[n.name].copy())
                    if isinstance(n, exp.Column) and not n.table and n.name in aliases
                    else n
                )
            )
            hit = names[exprs.index(_sql(key))] if _sql(key) in exprs else None
        if hit is None:
            if s.args.get("distinct"):
                raise unsupported("SELECT DISTINCT ordered by an expression not in its select list")
            hit = self.fresh("s")
            names.append(hit)
            exprs.append(_sql(key))
        o = o.copy()
        o.set("this", _col(hit))
        return _sql(o)

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
                if _sql(named) not in keys:
                    keys.append(_sql(named))
                    groups.append(named)
                if keys.index(_sql(named)) not in members:
                    members.append(keys.index(_sql(named)))
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
        aggs: dict[str, str] = {_sql(u): name for u, name in lifted}  # agg SQL -> column name
        # agg SQL -> SQL of its first argument
        args: dict[str, str | None] = {_sql(u): _first_arg(call_of(u)) for u, _ in lifted}

        def replace(e: exp.Expr) -> exp.Expr:
            def fn(node: exp.Expr) -> exp.Expr:
                if isinstance(node, exp.Grouping | exp.GroupingId) and query_of(node) is None:
                    return self._grouping(node, group_sql, sets is not None, aggs, args)
                if self._is_unit(node):
                    key = _sql(node)
                    if key not in aggs:
                        aggs[key] = self.fresh("a")
                        args[key] = _first_arg(call_of(node))
                    return _col(aggs[key])
                if not isinstance(node, exp.Alias | exp.Ordered) and self.matchable(node) in group_sql:
                    return _col(group_names[group_sql.index(self.matchable(node))])
                return node

            return e.transform(fn, copy=True)

        selects = [replace(e) for e in selects]
        order_keys = [replace(o) for o in order_keys]
        having = replace(having) if having is not None else None
        qualify_ = replace(qualify_) if qualify_ is not None else None
        if not aggs and not groups:  # a row per grouping set needs a column: a COUNT(*) nobody reads
            if sets is not None and len(sets) > 1:  # DuckDB gives one row for GROUPING SETS ((), ())
                raise unsupported("GROUPING SETS of no columns without an aggregate")
            aggs[_sql(exp.Count(this=exp.Star()))] = self.fresh("a")
            args[next(iter(aggs))] = None
        with_arg = [a for a in args.values() if a is not None]
        types = iter(self.node_types(rel, with_arg) if with_arg else [])
        node = Aggregate(
            tuple(group_names) + tuple(aggs.values()),
            child=rel,
            groups=tuple(_sql(g) for g in groups),
            aggs=tuple(aggs),
            key_types=self.hash_types(rel, [_sql(g) for g in groups]),
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
        keys = [_sql(unparen_key(a)) for a in node.expressions]
        if any(k not in group_sql for k in keys):
            raise unsupported("GROUPING() of an expression not grouped by as written")
        if not sets:
            return exp.cast(exp.Literal.number(0), exp.DataType.build("BIGINT"))
        key = f"GROUPING({', '.join(keys)})"
        if key not in aggs:
            aggs[key] = self.fresh("a")
            args[key] = None
        return _col(aggs[key])

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
        for root in _outermost(roots):
            if not row_columns(root) <= set(rel.columns):  # a lambda's parameter, an outer query's column
                raise unsupported("a subquery inside an expression over columns of another scope")
            sql = _sql(root)
            if sql not in exprs:
                names.append(self.fresh("p"))
                exprs.append(sql)
            root.replace(_col(names[exprs.index(sql)]))
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
        return _TOKEN.sub(lambda m: '"' + self.same.get(m.group(1), m.group(1)), _sql(e))

    def tokens(self, e: exp.Expr) -> list[str]:
        """The tokens of the subqueries ``e`` holds."""
        sql = _sql(e)
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
                key = _sql(node)
                if key not in found:
                    found[key] = self.fresh("w")
                    partitions.append([_sql(p) for p in node.args.get("partition_by") or []])
                return _col(found[key])
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
        left = self.query(_unparen(tree.left), prefix=None)
        right = self.query(_unparen(tree.right), prefix=None)
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
                hidden[name] = _sql(_over_outputs(key, names, cols))
            o = o.copy()
            o.set("this", _col(name))
            keys.append(_sql(o))
        if hidden:  # the sort keys as columns beside the outputs; the sort keeps only the outputs
            exprs = tuple(q(c) for c in cols) + tuple(hidden.values())
            rel = Project(cols + tuple(hidden), child=rel, exprs=exprs)
        return limited(rel, cols, keys, row_limit(tree, self), self)

    def by_name(self, tree: exp.SetOperation, left: Node, right: Node) -> tuple[Node, Node, list[str]]:
        """UNION [ALL] BY NAME: both sides projected onto every name (left's first, then the
        right's new ones; matched case-insensitively), NULL where a side lacks the column."""
        lnames = cast(exp.Query, _unparen(tree.left)).named_selects
        rnames = cast(exp.Query, _unparen(tree.right)).named_selects
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
        where_conj = _conjuncts(self.names(where.this.copy())) if where is not None else []
        if from_ is None:
            return self.filter(Values(("__one",)), where_conj)
        joins = s.args.get("joins") or []
        if isinstance(from_.this, exp.Lateral):
            raise unsupported("LATERAL as the first FROM item")
        sources = [self.source(from_.this, s)] + [self.source(j.this, s) for j in joins]
        lateral = [False] + [isinstance(j.this, exp.Lateral) for j in joins]
        kinds = [JoinKind.INNER] + [_join_kind(j) for j in joins]
        ons: list[list[exp.Expr]] = [[]]
        ons += [_conjuncts(self.names(j.args["on"].copy())) if j.args.get("on") else [] for j in joins]
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
        cond = _sql(exp.and_(*conj) if len(conj) > 1 else conj[0])
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
        for c in _scope_find(s, exp.Column):
            if c.table == alias and c.name not in used:
                used.append(c.name)
        if not used:  # e.g. COUNT(*) over the table: still need its rows
            used = [info.columns[0][0]]
        return Scan(tuple(f"{alias}.{c}" for c in used), table=info.name, source_columns=tuple(used))

    def lateral(self, sub: exp.Subquery, alias: str) -> Node:
        """A LATERAL subquery's plan: it may read the columns of the FROM items before it, which
        stay as they are for DuckDB to decorrelate where the join runs (see ``Join.lateral``)."""
        if _outer_aggregate(sub.this, self.aggregates):
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
            function=f"({_sql(rows)})",
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
            cond = _sql(exp.and_(*on_conj)) if on_conj else "true"  # LEFT ... ON true keeps its rows
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
            ca, cb = _cols(a), _cols(b)
            if ca and cb and ca <= lset and cb <= rset:
                lkeys.append(a)
                rkeys.append(b)
            elif ca and cb and ca <= rset and cb <= lset:
                lkeys.append(b)
                rkeys.append(a)
        ltypes = self.node_types(left, [_sql(k) for k in lkeys]) if lkeys else []
        rtypes = self.node_types(right, [_sql(k) for k in rkeys]) if rkeys else []
        _check_spreadable([*ltypes, *rtypes])
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
    def names(self, e: exp.Expr) -> exp.Expr:
        """Rewrite qualified columns ``t.c`` to the plan's unique column names ``"t.c"``, and plan each
        uncorrelated subquery separately, leaving a token table in its place."""

        def fn(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Subquery | exp.Exists) and isinstance(node.this, exp.Query):
                return self.subquery(node)
            if isinstance(node, exp.Column) and node.table:
                return _col(f"{node.table}.{node.name}")
            return node

        return e.transform(fn, copy=False) if not isinstance(e, exp.Column) else fn(e)

    def subquery(self, node: exp.Subquery | exp.Exists) -> exp.Expr:
        """Plan a subquery on its own; a token stands for it in the expression. A correlated one
        (it reads a column of the outer row) is evaluated by DuckDB itself, inline, wherever the
        outer row is: the distribution pass gives it every rank's inputs whole (replicated)."""
        body = node.this
        token = self.fresh("sq")
        if outer_columns(body):
            if _outer_aggregate(body, self.aggregates):
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
            placeholder.set("expressions", [exp.func("any_value", _col(columns[0]))])
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


def _conjuncts(e: exp.Expr) -> list[exp.Expr]:
    """Split an AND tree (through parentheses), dropping literal TRUE left behind by rewrites."""
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.And):
        return _conjuncts(e.this) + _conjuncts(e.expression)
    if isinstance(e, exp.Boolean) and e.this is True:
        return []
    return [e]


def _first_arg(call: exp.Expr) -> str | None:
    """SQL of an aggregate call's first argument (None for COUNT(*) and argument-less calls)."""
    first = call.this if not isinstance(call, exp.Anonymous | exp.AnonymousAggFunc) else None
    if isinstance(call, exp.Anonymous | exp.AnonymousAggFunc) and call.expressions:
        first = call.expressions[0]
    if isinstance(first, exp.Distinct):
        first = first.expressions[0] if len(first.expressions) == 1 else None
    if not isinstance(first, exp.Expr) or isinstance(first, exp.Star | exp.Order):
        return None
    return _sql(first)


def _outer_aggregate(body: exp.Expr, aggregates: Aggregates) -> bool:
    """Whether an aggregate inside the subquery reads an outer column: SQL then aggregates it in
    the outer query, which the builder (planning scopes one by one) would not see."""
    outer = {id(c) for c in outer_columns(body)}
    return any(
        aggregates.is_call(f) and any(id(c) in outer for c in f.find_all(exp.Column))
        for f in body.find_all(exp.Func)
    )


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
            return _col(cols[lower.index(n.name.lower())])
        return n

    return key.transform(output, copy=True)


def _unparen(e: exp.Expr) -> exp.Expr:
    while isinstance(e, exp.Subquery) and not e.alias:
        e = e.this
    return e


def _outermost(roots: list[exp.Expr]) -> list[exp.Expr]:
    """The expressions that are not part of another one of them (its column computes both)."""
    ids = {id(r) for r in roots}
    out: list[exp.Expr] = []
    for r in roots:
        p = r.parent
        while p is not None and id(p) not in ids:
            p = p.parent
        if p is None and all(r is not o for o in out):
            out.append(r)
    return out


def _cols(e: exp.Expr) -> set[str]:
    return {c.name for c in e.find_all(exp.Column)}


def _scope_find(s: exp.Expr, kind: type):
    """Nodes of ``kind`` in this SELECT, not inside its WITH clause (CTE bodies are their own scopes)."""
    for key, value in s.args.items():
        if key in ("with_", "with"):
            continue
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, exp.Expr):
                yield from v.find_all(kind)
