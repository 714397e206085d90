"""DESCRIBE and SHOW TABLES: questions about names and types, answered from the planner's schema DB.

Its tables are the catalog's, created empty with the same column types, and it binds a query as the
ranks would; what it answers is what single-process DuckDB answers over the data. The answer travels
as constant rows of a driver query (DuckDB on the driver casts them back to the statement's types).
SUMMARIZE reads the data and other SHOW forms describe settings, which differ on the driver: those
stay refused.
"""

from __future__ import annotations

from sqlglot import exp

from duckflock.catalog import Catalog
from duckflock.plan.nodes import DriverQuery
from duckflock.sql.schema_db import SchemaDB
from duckflock.sqltext import quote_ident as q
from duckflock.sqltext import sql_literal


def is_schema_question(tree: exp.Expr, catalog: Catalog) -> bool:
    """DESCRIBE <table or query>, SHOW [ALL] TABLES, SHOW <table>."""
    if isinstance(tree, exp.Describe):
        return not tree.args.get("style") and not tree.args.get("as_json")
    if isinstance(tree, exp.Show):
        return tree.name.upper() in ("TABLES", "ALL TABLES")
    if isinstance(tree, exp.Command) and tree.name.upper() == "SHOW":
        name = str(tree.expression).strip().strip('"').lower()
        return any(name == t.lower() for t in catalog.tables)
    return False


def schema_answer(text: str, schema_db: SchemaDB, described: list[tuple[str, str]]) -> DriverQuery:
    """The statement's rows (``described``: its columns' names and types), computed now, as a
    driver query of constants."""
    rows = schema_db.con.sql(text).fetchall()
    names = [f"c{i}" for i in range(len(described))]
    casts = ", ".join(f"CAST({c} AS {t}) AS {q(n)}" for c, (n, t) in zip(names, described, strict=True))
    if rows:
        values = ", ".join("(" + ", ".join(sql_literal(v) for v in row) + ")" for row in rows)
        sql = f"SELECT {casts} FROM (VALUES {values}) AS v({', '.join(names)})"
    else:
        sql = f"SELECT {casts} FROM (SELECT {', '.join(f'NULL AS {c}' for c in names)}) WHERE false"
    columns = tuple(f"__d{i}" for i in range(len(described)))
    what = "a question about the catalog's names and types"
    return DriverQuery(columns, sql=sql, reason=what, construct="DESCRIBE / SHOW")
