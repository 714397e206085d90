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
        side, on = join.this, join.args.get("on")
        if not join.is_semi_or_anti_join or on is None or not isinstance(side, exp.Table | exp.Subquery):
            continue
        name = side.alias_or_name.lower()
        fresh = next(f"{name}_{n}" for n in range(1, 1 << 30) if f"{name}_{n}" not in taken)
        taken.add(fresh)
        renamed = False
        for col in list(on.find_all(exp.Column)):
            if col.table.lower() == name and not col.args.get("db") and not _named_within(col, on, name):
                col.set("table", exp.to_identifier(fresh, quoted=True))
                renamed = True
        if renamed:
            side.set("alias", exp.TableAlias(this=exp.to_identifier(fresh, quoted=True)))
    return tree


def unshadow_nested_sources(tree: exp.Expr, derived: set[str]) -> exp.Expr:
    """Before qualify: FROM items of nested queries named like one of ``derived`` (lower-case
    names of derived tables and CTEs) defined by an enclosing query get fresh names."""
    taken = {i.name.lower() for i in tree.find_all(exp.Identifier)}
    for select in list(tree.find_all(exp.Select)):
        outer = query_of(select)
        if outer is None:
            continue
        enclosing: set[str] = set()
        while outer is not None:
            if isinstance(outer, exp.Select):
                enclosing |= {a.lower() for a in from_items(outer)}
            outer = query_of(outer)
        for alias, item in from_items(select).items():
            name = alias.lower()
            if name not in derived or name not in enclosing or not isinstance(item, exp.Table | exp.Subquery):
                continue
            fresh = next(f"{name}_{n}" for n in range(1, 1 << 30) if f"{name}_{n}" not in taken)
            taken.add(fresh)
            for col in list(select.find_all(exp.Column)):
                if col.table.lower() == name and not col.args.get("db") and _binder(col, name) is select:
                    col.set("table", exp.to_identifier(fresh, quoted=True))
            table_alias = item.args.get("alias")
            if isinstance(table_alias, exp.TableAlias):
                table_alias.set("this", exp.to_identifier(fresh, quoted=True))
            else:
                item.set("alias", exp.TableAlias(this=exp.to_identifier(fresh, quoted=True)))
    return tree


def _binder(col: exp.Column, name: str) -> exp.Expr | None:
    """The innermost SELECT around ``col`` with a FROM item called ``name``."""
    node = query_of(col)
    while node is not None:
        if isinstance(node, exp.Select) and name in (a.lower() for a in from_items(node)):
            return node
        node = query_of(node)
    return None


def _named_within(col: exp.Column, top: exp.Expr, name: str) -> bool:
    """Whether a query between ``col`` and ``top`` has a source called ``name`` (it then means that)."""
    node = col.parent
    while node is not None and node is not top:
        if isinstance(node, exp.Select) and name in (a.lower() for a in from_items(node)):
            return True
        node = node.parent
    return False


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
