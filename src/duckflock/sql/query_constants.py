"""Functions whose value is the query's own, not each rank's.

DuckDB fixes ``now()``, ``current_date`` and their kin once per transaction: every row of a query
sees one instant. Each rank's DuckDB would take its own (``count(DISTINCT now())`` was the rank
count; a join on it matched nothing), so the driver evaluates them once and the ranks get that
value as a typed constant. The catalogs of the ranks' own DuckDB (information_schema, duckdb_tables()
and the like) hold none of duckflock's tables, and every rank runs its own query text in its own
transaction (current_query(), txid_current()): these are refused outright, as answering on the
driver would describe the driver's DuckDB just as wrongly. (Functions of the session, such as
current_setting(), are answered on the driver: sql/round_trip.py.)
"""

from __future__ import annotations

import re
from collections.abc import Collection

from sqlglot import exp

from duckflock.errors import SqlError
from duckflock.sql.functions import function_name
from duckflock.sql.schema_db import SchemaDB

# DuckDB's names (as sqlglot renders the call, lower case) of the clock at the transaction's start.
_CLOCK = frozenset(
    {
        "now",
        "current_timestamp",
        "transaction_timestamp",
        "get_current_timestamp",
        "localtimestamp",
        "current_localtimestamp",
        "current_time",
        "get_current_time",
        "localtime",
        "current_localtime",
        "current_date",
        "today",
    }
)
_CATALOG_SCHEMAS = frozenset({"information_schema", "pg_catalog"})
# DuckDB's views of its own catalog that need no schema name (duckdb_*() ones as views, too).
_CATALOG_VIEWS = frozenset(
    {
        "sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema", "pg_am",
        "pg_attrdef", "pg_attribute", "pg_class", "pg_collation", "pg_constraint", "pg_database",
        "pg_depend", "pg_description", "pg_enum", "pg_index", "pg_indexes", "pg_namespace",
        "pg_prepared_statements", "pg_proc", "pg_sequence", "pg_sequences", "pg_settings", "pg_tables",
        "pg_tablespace", "pg_type", "pg_views",
    }
)  # fmt: skip
# Table functions that run SQL text of their own: on a rank it would read none of the catalog's tables.
_RUNS_TEXT = frozenset({"query", "query_table"})
# The query's text and ids as the engine ran it: each rank runs another text, in its own transaction.
_OF_THE_RUN = frozenset(
    {"current_query", "current_query_id", "current_connection_id", "current_transaction_id", "txid_current"}
)
# The seed of the connection's random numbers: every rank's would draw the same ones from then on.
_SEEDS = frozenset({"setseed"})


def check_introspection(tree: exp.Expr, tables: Collection[str]) -> None:
    """Refuse what would describe the ranks' or the driver's DuckDB instead of duckflock's data
    (``tables``: the catalog's, which may have such names, in any case)."""
    for node in tree.walk():
        if isinstance(node, exp.Table):
            table_fn = node.this if isinstance(node.this, exp.Func) else None
            name = _name(table_fn) if table_fn is not None else node.name.lower()
            catalog_view = (
                table_fn is None
                and not node.args.get("db")
                and name not in {t.lower() for t in tables}
                and (name in _CATALOG_VIEWS or name.startswith("duckdb_"))
            )
            if (
                (node.args.get("db") and node.text("db").lower() in _CATALOG_SCHEMAS)
                or (table_fn is not None and name.startswith(("duckdb_", "pragma_")))
                or catalog_view
            ):
                raise SqlError(
                    f"{node.sql(dialect='duckdb')} describes a DuckDB instance, not duckflock's catalog: "
                    "use SHOW TABLES and DESCRIBE"
                )
            if table_fn is not None and name in _RUNS_TEXT:
                raise SqlError(f"{name}() is not supported: the SQL text it runs is not planned by duckflock")
            if _statement_in_query(node):
                raise SqlError(f"{node.name} is supported as a statement of its own, not inside a query")
        elif isinstance(node, exp.Show) and node is not tree:  # WITH x AS (SHOW TABLES)
            raise SqlError("SHOW is supported as a statement of its own, not inside a query")
        elif isinstance(node, exp.Func) and _name(node) in _OF_THE_RUN:
            raise SqlError(f"{_name(node)}() is not supported: the query runs as other queries on every rank")
        elif isinstance(node, exp.Func) and _name(node) in _SEEDS:
            raise SqlError(f"{_name(node)}() is not supported: every rank draws random numbers of its own")


def check_introspection_text(sql: str) -> None:
    """check_introspection for text sqlglot cannot parse: any word naming what it refuses (a column
    so named too: such a query is refused, not answered wrongly)."""
    for word in re.findall(r"\w+", sql.lower()):
        if word in _REFUSED_WORDS or word.startswith(("duckdb_", "pragma_")):
            raise SqlError(f"{word}: not supported in a query duckflock's SQL parser (sqlglot) cannot read")


_REFUSED_WORDS = _CATALOG_SCHEMAS | _CATALOG_VIEWS | _RUNS_TEXT | _OF_THE_RUN | _SEEDS | {"show", "pragma"}


def _statement_in_query(table: exp.Table) -> bool:
    """``(SHOW TABLES)`` or ``(PRAGMA ...)`` in FROM, which sqlglot reads as a table named SHOW."""
    ident = table.this
    return (
        isinstance(ident, exp.Identifier)
        and not ident.quoted
        and ident.name.upper() in ("SHOW", "PRAGMA")
        and isinstance(table.parent, exp.Subquery)
    )


def fix_clock(tree: exp.Expr, schema_db: SchemaDB) -> exp.Expr:
    """Replace each call of the transaction's clock by its value, read once on the driver."""
    calls = [n for n in tree.find_all(exp.Func) if _name(n) in _CLOCK and not _arguments(n)]
    if not calls:
        return tree
    texts = [c.sql(dialect="duckdb") for c in calls]
    columns = ", ".join(f"CAST({t} AS VARCHAR), typeof({t})" for t in texts)
    row = schema_db.con.execute(f"SELECT {columns}").fetchall()[0]  # one transaction: one instant
    for i, call in enumerate(calls):
        value, typ = row[2 * i], row[2 * i + 1]
        call.replace(exp.cast(exp.Literal.string(value), exp.DataType.build(typ, dialect="duckdb")))
    return tree


def reads_clock(sql: str) -> bool:
    """Whether the query's text may call the transaction's clock (a name of it as a word: a column
    so named counts too). A plan then holds the instant it was made at and must not be reused."""
    return _CLOCK_WORD.search(sql) is not None


_CLOCK_WORD = re.compile(r"\b(" + "|".join(sorted(_CLOCK)) + r")\b", re.IGNORECASE)


def _name(node: exp.Expr) -> str:
    """The call's DuckDB name; a keyword without parentheses (CURRENT_TIMESTAMP) is its own."""
    return function_name(node) or node.sql(dialect="duckdb").lower()


def _arguments(node: exp.Expr) -> list[exp.Expr]:
    return [v for k, v in node.args.items() if k != "this" and v not in (None, [], False)] + (
        [node.this] if isinstance(node.this, exp.Expr) and not isinstance(node, exp.Anonymous) else []
    )
