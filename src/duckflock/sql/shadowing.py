"""Names DuckDB binds differently from sqlglot's ``qualify``, made explicit so both read them alike.

- ``t.a`` in the ON clause of a SEMI or ANTI join whose right side is named ``t``: DuckDB reads the
  right side's column; sqlglot does not count that side among the query's sources and, when a left
  column is called ``t``, reads field ``a`` of it (a STRUCT) instead. The right side gets a name no
  column has.
- A FROM item of a subquery named like a derived table or CTE of an enclosing query: sqlglot's
  predicate pushdown, moving a predicate holding the subquery into that derived table, rewrites the
  name's columns inside the subquery too. The subquery's item gets a name of its own.
- A name in an ORDER BY expression (not a bare name) that is both an output alias and an input
  column: DuckDB reads the input column, sqlglot leaves it to the alias. It is qualified with its
  source.
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.optimizer.resolver import Resolver
from sqlglot.optimizer.scope import traverse_scope
from sqlglot.schema import Schema

from duckflock.sql.scopes import from_items, query_of


def unshadow_semi_join_sides(tree: exp.Expr) -> exp.Expr:
    """Before qualify: each SEMI / ANTI join's right side under a fresh name in its ON clause."""
    taken = {i.name.lower() for i in tree.find_all(exp.Identifier)}
    for join in list(tree.find_all(exp.Join)):
        side, on, select = join.this, join.args.get("on"), query_of(join)
        if join.is_semi_or_anti_join and on is not None and isinstance(side, exp.Table | exp.Subquery):
            _rename(side, side.alias_or_name.lower(), on, select, taken)
    return tree


def unshadow_nested_sources(tree: exp.Expr) -> exp.Expr:
    """Before qualify: every FROM item named like one met before it (outer queries first) gets a
    fresh name, so that each name means one FROM item in the whole query. The plan names columns
    ``alias.column`` query-wide (a scan reads the columns named after its alias), and sqlglot's
    predicate pushdown rewrites a derived table's columns by name, inside nested queries too."""
    taken = {i.name.lower() for i in tree.find_all(exp.Identifier)}
    seen: set[str] = set()
    for select in list(tree.find_all(exp.Select)):
        for alias, item in from_items(select).items():
            name = alias.lower()
            if not isinstance(item, exp.Table | exp.Subquery):
                continue
            if name in seen:
                _rename(item, name, select, select, taken)
            else:
                seen.add(name)
    return tree


def _rename(item: exp.Expr, name: str, within: exp.Expr, select: exp.Expr | None, taken: set[str]) -> None:
    """Give FROM item ``item`` of ``select`` a fresh name, and the columns in ``within`` that name
    it (``name.col``, not meant for a nested query's own ``name``) that name too."""
    fresh = next(f"{name}_{n}" for n in range(1, 1 << 30) if f"{name}_{n}" not in taken)
    columns = [
        c
        for c in within.find_all(exp.Column)
        if c.table.lower() == name and not c.args.get("db") and _binder(c, name) is select
    ]
    taken.add(fresh)
    for c in columns:
        c.set("table", exp.to_identifier(fresh, quoted=True))
    alias = item.args.get("alias")
    if isinstance(alias, exp.TableAlias):  # keeps its column list: (SELECT ...) AS x(a, b)
        alias.set("this", exp.to_identifier(fresh, quoted=True))
    else:
        item.set("alias", exp.TableAlias(this=exp.to_identifier(fresh, quoted=True)))


def _binder(col: exp.Column, name: str) -> exp.Expr | None:
    """The innermost SELECT around ``col`` with a FROM item called ``name``."""
    node = query_of(col)
    while node is not None:
        if isinstance(node, exp.Select) and name in (a.lower() for a in from_items(node)):
            return node
        node = query_of(node)
    return None


def order_by_input_columns(expression: exp.Expr, schema: Schema) -> exp.Expr:
    """After qualify: in ORDER BY expressions, names that are input columns as well as output
    aliases qualified with their source, as DuckDB binds them."""
    for scope in traverse_scope(expression):
        select = scope.expression
        order = select.args.get("order") if isinstance(select, exp.Select) else None
        if order is None:
            continue
        aliases = {e.alias for e in select.expressions if isinstance(e, exp.Alias)}
        resolver = Resolver(scope, schema)
        for ordered in order.expressions:
            if isinstance(ordered.this, exp.Column):  # a bare name is the output column
                continue
            for col in ordered.this.find_all(exp.Column):
                if col.table or col.name not in aliases or query_of(col) is not select:
                    continue
                table = resolver.get_table(col)
                if table is not None:
                    col.set("table", table.copy())
    return expression
