"""FROM items written in forms the binder does not read, rewritten to ones it does, with the column
names DuckDB gives them (DuckDB, not sqlglot, says what a FROM item's columns are called).

- ``a NATURAL JOIN b``: ``a JOIN b USING (c, ...)`` over the columns both sides have (DuckDB
  rejects a NATURAL JOIN without one); sql/using_joins.py then checks the USING as for one written so.
- ``t AS a(x, y)``: ``(SELECT k AS x, s AS y, ... FROM t) AS a``, every column named as DuckDB
  names it (the first renamed, a repeated name numbered: ``x_1``).
- ``(VALUES ...) v``: its column list written out as DuckDB names the columns (``col0``, ...), so
  every reference to them resolves; the builder plans the rows as a relation on every rank.
"""

from __future__ import annotations

from sqlglot import exp

from duckflock.errors import CatalogError, SqlError
from duckflock.sql.allowlist import unsupported
from duckflock.sql.schema_db import SchemaDB
from duckflock.sql.using_joins import describe_in_scope, is_comma

# DuckDB's name for a derived table written without one.
UNNAMED = "unnamed_subquery"


def rewrite_from_forms(tree: exp.Expr, schema_db: SchemaDB) -> exp.Expr:
    for values in list(tree.find_all(exp.Values)):
        _name_values_columns(values, schema_db)
    for table in list(tree.find_all(exp.Table)):
        alias = table.args.get("alias")
        if isinstance(table.this, exp.Identifier) and isinstance(alias, exp.TableAlias) and alias.columns:
            _renamed_table_as_derived(table, schema_db)
    for select in list(tree.find_all(exp.Select)):
        if any(_natural(j) for j in select.args.get("joins") or []):
            _natural_as_using(select, schema_db)
    return tree


def _natural(join: exp.Join) -> bool:
    return (join.args.get("method") or "").upper() == "NATURAL"


def _natural_as_using(select: exp.Select, schema_db: SchemaDB) -> None:
    from_ = select.args.get("from_") or select.args.get("from")
    joins = select.args.get("joins") or []
    items = [from_.this if from_ is not None else None, *(j.this for j in joins)]
    after_comma = 0  # a comma binds after every JOIN: ``a, b NATURAL JOIN c`` joins b and c
    for j, join in enumerate(joins, start=1):
        after_comma = j if is_comma(join) else after_comma
        if not _natural(join):
            continue
        left = {n.lower() for i in range(after_comma, j) for n, _ in _columns(items[i], schema_db)}
        using = [n for n, _ in _columns(items[j], schema_db) if n.lower() in left]
        join.set("method", None)
        join.set("using", [exp.to_identifier(n, quoted=True) for n in using])


def _columns(item: exp.Expr | None, schema_db: SchemaDB) -> list[tuple[str, str]]:
    """A FROM item's columns, as DuckDB names them (with the CTEs in scope)."""
    if item is None:  # joins without FROM: DuckDB rejects them
        raise unsupported("NATURAL JOIN without FROM")
    try:
        return describe_in_scope(item, exp.select("*").from_(item.copy()), schema_db)
    except (SqlError, CatalogError):
        raise unsupported("NATURAL JOIN whose sides' columns could not be named") from None


def _renamed_table_as_derived(table: exp.Table, schema_db: SchemaDB) -> None:
    """``t AS a(x, y)`` as a derived table naming t's columns so."""
    alias = table.args["alias"]
    plain = table.copy()
    plain.set("alias", None)
    bare = exp.select("*").from_(plain)
    named = exp.select("*").from_(table.copy())
    try:
        sources = describe_in_scope(table, bare, schema_db)
        names = describe_in_scope(table, named, schema_db)
    except (SqlError, CatalogError):
        raise unsupported("column aliases on a FROM item whose columns could not be named") from None
    body = exp.select(
        *(
            exp.alias_(exp.column(s, quoted=True), n, quoted=True)
            for (s, _), (n, _) in zip(sources, names, strict=True)
        )
    ).from_(plain)
    table.replace(exp.Subquery(this=body, alias=exp.TableAlias(this=alias.this.copy())))


def _name_values_columns(values: exp.Values, schema_db: SchemaDB) -> None:
    """Every column of a VALUES list in FROM named in its alias, as DuckDB names them."""
    if not isinstance(values.parent, exp.From | exp.Join):
        return  # not a FROM item: refused by name (sql/allowlist.py)
    if next(values.find_all(exp.Column), None) is not None:
        raise unsupported("VALUES in FROM reading columns of the query")
    alias = values.args.get("alias")
    if not isinstance(alias, exp.TableAlias):
        alias = exp.TableAlias(this=exp.to_identifier(UNNAMED))
    values.set("alias", alias)
    try:
        names = describe_in_scope(values, exp.select("*").from_(values.copy()), schema_db)
    except (SqlError, CatalogError):
        raise unsupported("VALUES in FROM whose columns could not be named") from None
    alias.set("columns", [exp.to_identifier(n, quoted=True) for n, _ in names])
