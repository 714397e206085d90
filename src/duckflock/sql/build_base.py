"""The builder's state and what every clause's planning asks of it: plan names for expressions,
subqueries planned on their own, DuckDB's types (sql/builder.py assembles the clauses)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from sqlglot import exp

from duckflock.catalog import Catalog
from duckflock.catalog.partitioning import canonical_hash_type, check_spreadable
from duckflock.errors import DuckflockError
from duckflock.plan.nodes import Filter, Node, Project
from duckflock.sql.allowlist import unsupported
from duckflock.sql.ast_helpers import col, outer_aggregate, outermost, to_sql
from duckflock.sql.functions import WRAPPERS, Aggregates, call_of
from duckflock.sql.schema_db import SchemaDB
from duckflock.sql.scopes import outer_columns, query_of
from duckflock.sql.subquery_columns import row_columns
from duckflock.sqltext import quote_ident as q

# The refusal of a rewritten query (or part of one) that DuckDB rejects, where it accepted the query.
REWRITE_REJECTED = "a rewrite DuckDB does not accept"


class BuilderBase:
    """One query's planning state: the CTEs in scope, the subqueries planned so far (by token)."""

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

    def query(self, tree: exp.Expr, prefix: str | None) -> Node:
        """A SELECT (or set operation) as a node whose columns are named prefix.name (or fresh):
        sql/builder.py's, which every clause's subqueries and FROM items recurse into."""
        raise NotImplementedError

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

    def filter(self, rel: Node, conj: list[exp.Expr]) -> Node:
        if not conj:
            return rel
        cond = to_sql(exp.and_(*conj) if len(conj) > 1 else conj[0])
        return Filter(rel.columns, child=rel, condition=cond, **self.attach(cond))

    # ---- types --------------------------------------------------------------------------------------
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
        check_key_types(types)
        return tuple(canonical_hash_type(t) for t in types)


# A subquery's token at the start of a quoted name: "__sq3" or "__sq3.k".
_TOKEN = re.compile(r'"(__sq\d+)(?=[".])')


def check_key_types(types: Iterable[str]) -> None:
    """Refuse keys of types rows must not be hashed or ranged by (catalog/partitioning.py)."""
    try:
        for t in types:
            check_spreadable(t)
    except ValueError as e:
        raise unsupported(str(e), "keys, groups or set operations over VARIANT or GEOMETRY values") from None
