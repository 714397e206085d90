"""Build a logical plan from SQL.

sqlglot parses the text; the passes of sql/passes.py check it, qualify every column, decorrelate
subqueries into joins and push predicates into join conditions; the builder (sql/builder.py) then
maps the normalized tree onto plan nodes, which DuckDB checks against the query's own result types.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError

from duckflock.catalog import Catalog
from duckflock.errors import CatalogError, NotDistributed, SqlError, duckdb_message
from duckflock.plan.nodes import Node, WithSubqueries, own_sql, walk
from duckflock.plan.render import render
from duckflock.sql import passes
from duckflock.sql.allowlist import unsupported
from duckflock.sql.builder import Builder
from duckflock.sql.describe import is_schema_question, schema_answer
from duckflock.sql.driver_fallback import on_driver
from duckflock.sql.query_constants import check_introspection, check_introspection_text
from duckflock.sql.schema_db import SchemaDB
from duckflock.sqltext import quote_ident as q


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


def bind(
    sql: str,
    catalog: Catalog,
    schema_db: SchemaDB,
    driver_fallback_bytes: int = 0,
    *,
    disabled_passes: Collection[str] = (),
    trace: list[passes.Step] | None = None,
) -> BoundQuery:
    """The query's plan. DuckDB must accept the query; what duckflock cannot distribute runs on
    the driver when its tables total at most ``driver_fallback_bytes``, else it is refused.
    ``disabled_passes`` names passes of sql/passes.py to leave out (for tests); ``trace`` gets
    what each pass did (EXPLAIN VERBOSE)."""
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
        plan = _distributed(text, tree, catalog, schema_db, disabled_passes, trace)
        _check_plan(plan, described, schema_db)
    except NotDistributed as e:  # DuckDB accepts it, duckflock cannot distribute it (yet)
        plan = on_driver(text, catalog, len(described), e, driver_fallback_bytes)
    return BoundQuery.of(plan, text, described, schema_db)


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


def _distributed(
    text: str,
    tree: exp.Expr,
    catalog: Catalog,
    schema_db: SchemaDB,
    disabled_passes: Collection[str] = (),
    trace: list[passes.Step] | None = None,
) -> Node:
    ctx = passes.Context(text, catalog, schema_db)
    tree = passes.run(passes.PREPARE, tree, ctx, disabled_passes, trace)
    try:
        tree = passes.run(passes.NORMALIZE, tree, ctx, disabled_passes, trace)
        builder = Builder(catalog, schema_db, ctx.aggregates)
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
