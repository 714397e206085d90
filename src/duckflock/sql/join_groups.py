"""Parenthesized joins, ``(a JOIN b ON p) JOIN c``, rewritten to the flat join lists the binder reads.

- A group first in FROM is its join list without the parentheses: DuckDB joins left to right.
- A group on the right of a join, ``a JOIN (b JOIN c ON p) ON q``, is ``a CROSS JOIN b JOIN c ON p
  AND q`` where every join involved is inner or cross: the same rows, its columns in the same order.
  After a comma (``a, (b JOIN c ON p)``) it stays after a comma, which binds after every JOIN.
  The group's own conditions saw only its items: their unqualified columns are qualified first
  (DuckDB names each item's columns), as ``a``'s columns are in scope after the move.
- A group with an alias, ``(a JOIN b ON p) AS j``, is a derived table ``(SELECT * FROM a JOIN b ON
  p) AS j(...)``, its columns named as DuckDB names the group's (``x``, ``x_1``).
- Any other group, ``a LEFT JOIN (b JOIN c ON p) ON q`` (undone, its joins would change the rows),
  is kept for sqlglot to qualify every column of the query, then made a derived table ``(SELECT
  b.x AS c0, c.y AS c1 FROM b JOIN c ON p) AS __g1`` whose columns the query reads for b's and c's.
  One on the right of a SEMI, ANTI, ASOF or USING join, or holding an ASOF or USING join, is
  refused by name.
"""

from __future__ import annotations

from sqlglot import exp

from duckflock.errors import CatalogError, SqlError
from duckflock.sql.allowlist import KEPT_GROUP, unsupported
from duckflock.sql.schema_db import SchemaDB
from duckflock.sql.scopes import in_subquery
from duckflock.sql.using_joins import describe_in_scope, is_comma

REFUSED = "a parenthesized join on the right of a SEMI, ANTI, ASOF or USING join, or holding one"


def flatten_join_groups(tree: exp.Expr, schema_db: SchemaDB) -> exp.Expr:
    for group in [g for g in tree.find_all(exp.Subquery) if _is_group(g) and g.alias]:
        _named_group_as_derived(group, schema_db)
    for select in list(tree.find_all(exp.Select)):
        _flatten(select, schema_db)
    return tree


def _is_group(node: exp.Expr) -> bool:
    """A parenthesized FROM item that is not a query: ``(a JOIN b ON p)``, ``((a))``, ``((s) JOIN b
    ON p)`` (sqlglot's Subquery is a Query: the inner parentheses of a group are one too)."""
    if not isinstance(node, exp.Subquery):
        return False
    inner = node.this
    if isinstance(inner, exp.Subquery):
        return bool(inner.args.get("joins")) or _is_group(inner)
    return not isinstance(inner, exp.Query)


def _parts(node: exp.Expr) -> tuple[exp.Expr, list[exp.Join]]:
    """A group's first item and the joins after it, nested groups first in it taken apart too."""
    joins = list(node.args.get("joins") or [])
    head = node.copy()
    head.set("joins", None)
    if _is_group(head) and not head.alias:
        inner_head, inner = _parts(head.this)
        return inner_head, inner + joins
    return head, joins


def _flatten(select: exp.Select, schema_db: SchemaDB) -> None:
    from_ = select.args.get("from_") or select.args.get("from")
    if from_ is None:
        return
    joins = list(select.args.get("joins") or [])
    if _is_group(from_.this) and not from_.this.alias:
        head, inner = _parts(from_.this.this)
        from_.set("this", head)
        joins = inner + joins
    out: list[exp.Join] = []
    for join in joins:
        item = join.this
        if not (_is_group(item) and not item.alias):
            out.append(join)
            continue
        head, inner = _parts(item.this)
        if not inner:  # ``(b)``: the item itself
            join.set("this", head)
            out.append(join)
            continue
        if not all(_plain_inner(j) for j in (join, *inner)):
            out.append(_kept(join, head, inner))
            continue
        _qualify_conditions(item, head, inner, schema_db)
        first = join.copy()
        first.set("this", head)
        on = join.args.get("on")
        first.set("on", None)
        if not is_comma(join):
            first.set("kind", "CROSS")
        last = inner[-1]
        if on is not None:
            own = last.args.get("on")
            last.set("on", on.copy() if own is None else exp.and_(own, on.copy()))
            last.set(
                "kind", None if (last.args.get("kind") or "").upper() == "CROSS" else last.args.get("kind")
            )
        out += [first, *inner]
    select.set("joins", out or None)


def _qualify_conditions(group: exp.Expr, head: exp.Expr, joins: list[exp.Join], schema_db: SchemaDB) -> None:
    """Each unqualified column of the group's join conditions named by the group's item that has it
    (of those the join sees: a group is joined left to right too)."""
    items = [head, *(j.this for j in joins)]
    columns: list[set[str]] | None = None
    for j, join in enumerate(joins, start=2):  # a join's condition sees the items up to its own
        on = join.args.get("on")
        if on is None:
            continue
        for column in list(on.find_all(exp.Column)):
            if column.table or in_subquery(column, on):
                continue
            if columns is None:
                columns = [{n.lower() for n, _ in _item_columns(group, i, schema_db)} for i in items]
            owners = [i for i, names in zip(items[:j], columns, strict=False) if column.name.lower() in names]
            if len(owners) != 1:  # an outer query's column: another here once the group is undone
                raise unsupported("a parenthesized join whose condition reads an outer query's column")
            column.set("table", exp.to_identifier(owners[0].alias_or_name))


def _item_columns(group: exp.Expr, item: exp.Expr, schema_db: SchemaDB) -> list[tuple[str, str]]:
    try:
        return describe_in_scope(group, exp.select("*").from_(item.copy()), schema_db)
    except (SqlError, CatalogError):
        raise unsupported("a parenthesized join whose columns could not be named") from None


def _kept(join: exp.Join, head: exp.Expr, joins: list[exp.Join]) -> exp.Join:
    """``join`` of the group (nested groups first in it undone), marked to become a derived table
    once sqlglot has qualified every column (``groups_as_derived_tables``)."""
    semi = (join.args.get("kind") or "").upper() in ("SEMI", "ANTI")  # sqlglot's scopes lose the group
    if (
        semi
        or any(j.args.get(k) for j in (join, *joins) for k in ("using", "method"))
        or any(isinstance(j.this, exp.Lateral) or _is_group(j.this) for j in joins)
    ):
        raise unsupported(REFUSED)
    flat = head.copy()
    flat.set("joins", joins)
    group = exp.Subquery(this=flat)
    group.meta[KEPT_GROUP] = True
    join.set("this", group)
    return join


def groups_as_derived_tables(expression: exp.Expr) -> exp.Expr:
    """After qualification: each kept group ``(b JOIN c ON p)`` as ``(SELECT b.x AS c0, c.y AS c1
    FROM b JOIN c ON p) AS __g1``, the query's columns of b and c read from it."""
    groups = [g for g in expression.find_all(exp.Subquery) if g.meta.get(KEPT_GROUP)]
    for n, group in enumerate(groups, start=1):
        del group.meta[KEPT_GROUP]
        flat = group.this
        items = {i.alias_or_name for i in [flat, *(j.this for j in flat.args.get("joins") or [])]}
        select = group.find_ancestor(exp.Select)
        assert select is not None  # a FROM item is in a SELECT
        outside = [c for c in select.find_all(exp.Column) if c.table in items and not _within(c, group)]
        for node in select.find_all(exp.Table, exp.Subquery):
            if node.alias_or_name in items and not _within(node, group) and node is not group:
                # The name means another item somewhere in the query.
                raise unsupported("a parenthesized join with an item named like another of the query")
        name = f"__g{n}"
        picked: dict[tuple[str, str], str] = {}
        for c in outside:
            picked.setdefault((c.table, c.name), f"c{len(picked)}")
        head = flat.copy()
        head.set("joins", None)
        columns = [
            exp.alias_(exp.column(col, table=tab, quoted=True), out, quoted=True)
            for (tab, col), out in picked.items()
        ]
        # COUNT(*) over the group reads none of its columns: it still needs its rows.
        body = exp.select(*(columns or [exp.alias_(exp.Literal.number(1), "c0", quoted=True)])).from_(head)
        body.set("joins", flat.args.get("joins"))
        for c in outside:
            c.replace(exp.column(picked[(c.table, c.name)], table=name, quoted=True))
        group.replace(
            exp.Subquery(this=body, alias=exp.TableAlias(this=exp.to_identifier(name, quoted=True)))
        )
    return expression


def _within(node: exp.Expr, ancestor: exp.Expr) -> bool:
    at: exp.Expr | None = node
    while at is not None:
        if at is ancestor:
            return True
        at = at.parent
    return False


def _plain_inner(join: exp.Join) -> bool:
    """An inner, cross or comma join without USING: one whose condition may move to a later join."""
    kind = (join.args.get("kind") or "").upper()
    plain = not join.args.get("side") and not join.args.get("method") and not join.args.get("using")
    return plain and kind in ("", "INNER", "CROSS") and not isinstance(join.this, exp.Lateral)


def _named_group_as_derived(group: exp.Subquery, schema_db: SchemaDB) -> None:
    """``(a JOIN b ON p) AS j`` as ``(SELECT * FROM a JOIN b ON p) AS j(x, y, x_1, z)``."""
    alias = group.args["alias"]
    try:
        names = describe_in_scope(group, exp.select("*").from_(group.copy()), schema_db)
    except (SqlError, CatalogError):
        raise unsupported("a parenthesized join whose columns could not be named") from None
    head, joins = _parts(group.this)
    body = exp.select("*").from_(head)
    body.set("joins", joins or None)
    columns = [exp.to_identifier(n, quoted=True) for n, _ in names]
    group.replace(exp.Subquery(this=body, alias=exp.TableAlias(this=alias.this.copy(), columns=columns)))
