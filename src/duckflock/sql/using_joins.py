"""JOIN ... USING where sqlglot's reading differs from DuckDB's is refused.

sqlglot writes a USING column as COALESCE of every side's column and joins a later USING on the
leftmost side's column. DuckDB takes the left side's column (and its type) after an INNER or LEFT
join, the right side's after a RIGHT join, COALESCE after a FULL join, and joins a later USING on
that merged column. The two agree where an INNER or LEFT join's two columns have one type, no
RIGHT join merges, and no later USING reads a column a FULL join merged; anything else is refused
(the driver may answer it: exact, as DuckDB reads it itself).
"""

from __future__ import annotations

from sqlglot import exp

from duckflock.errors import CatalogError, SqlError
from duckflock.sql.allowlist import unsupported
from duckflock.sql.schema_db import SchemaDB
from duckflock.sql.scopes import ctes_of
from duckflock.sqltext import quote_ident as q


def check_using_joins(tree: exp.Expr, schema_db: SchemaDB) -> None:
    for select in tree.find_all(exp.Select):
        joins = select.args.get("joins") or []
        if any(j.args.get("using") for j in joins):
            _check(select, joins, schema_db)


class _Items:
    """A SELECT's FROM items, with their columns' names and types asked of DuckDB once each."""

    def __init__(self, select: exp.Select, joins: list[exp.Join], schema_db: SchemaDB):
        from_ = select.args.get("from_") or select.args.get("from")
        assert from_ is not None  # a SELECT with joins has a FROM
        self.select, self.schema_db = select, schema_db
        self.items = [from_.this, *(j.this for j in joins)]
        self._columns: dict[int, list[tuple[str, str]]] = {}

    def columns(self, i: int) -> list[tuple[str, str]]:
        if i not in self._columns:
            self._columns[i] = _describe_item(self.select, self.items[i].alias_or_name, self.schema_db)
        return self._columns[i]

    def first_with(self, key: str, before: int, after_comma: int = 0) -> int | None:
        """The first item before ``before`` with column ``key``: the one sqlglot joins on."""
        first = next((i for i in range(before) if _has(self.columns(i), key)), None)
        if first is not None and first < after_comma:
            # DuckDB joins on the column of an item after the comma.
            raise unsupported(
                f"JOIN ... USING ({key}) after a comma in FROM, on a column of an item before it",
                "JOIN ... USING after a comma, on a column of an item before it",
            )
        return first


def _check(select: exp.Select, joins: list[exp.Join], schema_db: SchemaDB) -> None:
    items = _Items(select, joins, schema_db)
    full_merged: set[str] = set()
    merged: dict[str, set[int]] = {}  # USING column -> the FROM items whose column it merges
    after_comma = 0  # the first FROM item of the join a USING closes: a comma binds after every JOIN
    for j, join in enumerate(joins, start=1):
        if is_comma(join):
            after_comma = j
        using = [u.name for u in join.args.get("using") or []]
        for key in using:
            first = items.first_with(key, j, after_comma)
            merged.setdefault(key.lower(), {first} if first is not None else set()).add(j)
        side, kind = (join.side or "").upper(), (join.kind or "").upper()
        if using and side == "RIGHT":
            raise unsupported("RIGHT JOIN ... USING")
        if any(k.lower() in full_merged for k in using):
            raise unsupported("JOIN ... USING on a column an earlier FULL JOIN ... USING merged")
        if side == "FULL":
            full_merged |= {k.lower() for k in using}
        elif kind not in ("SEMI", "ANTI"):
            for key in using:
                _check_types(key, [items.columns(i) for i in range(j)], items.columns(j))
    if any(isinstance(p, exp.Star) for p in select.expressions):
        # sqlglot's * leaves out the column of that name of every other FROM item; DuckDB keeps it.
        for key, sources in merged.items():
            if any(_has(items.columns(i), key) for i in range(len(items.items)) if i not in sources):
                raise unsupported(
                    f"* over JOIN ... USING ({key}) and another FROM item with a column {key}",
                    "* over JOIN ... USING and another FROM item with a column of that name",
                )


def is_comma(join: exp.Join) -> bool:
    """Whether a join is a comma in FROM (``a, b``)."""
    return not any(join.args.get(k) for k in ("kind", "side", "on", "using", "method"))


def _check_types(key: str, lefts: list[list[tuple[str, str]]], right: list[tuple[str, str]]) -> None:
    """An INNER or LEFT join's USING column is the left one, of its type: sqlglot's COALESCE of
    both has it only where both sides have the one type."""
    rtype = next((t for n, t in right if n.lower() == key.lower()), None)
    ltype = next((t for cols in lefts for n, t in cols if n.lower() == key.lower()), None)
    if ltype is None or rtype is None or ltype != rtype:
        raise unsupported(
            f"JOIN ... USING ({key}) on columns of different types ({ltype}, {rtype})",
            "JOIN ... USING on columns of different types",
        )


def _has(columns: list[tuple[str, str]], key: str) -> bool:
    return any(n.lower() == key.lower() for n, _ in columns)


def _describe_item(select: exp.Select, alias: str, schema_db: SchemaDB) -> list[tuple[str, str]]:
    try:
        return describe_item(select, alias, schema_db)
    except (SqlError, CatalogError):
        raise unsupported(
            f"JOIN ... USING whose sides' columns could not be typed ({q(alias)})",
            "JOIN ... USING whose sides' columns could not be typed",
        ) from None


def describe_item(select: exp.Select, alias: str, schema_db: SchemaDB) -> list[tuple[str, str]]:
    """(name, type) of a FROM item's columns, as DuckDB binds ``alias.*`` over the query's FROM
    clause (with the CTEs in scope); DuckDB's error as SqlError / CatalogError."""
    probe = exp.Select(expressions=[exp.Column(this=exp.Star(), table=exp.to_identifier(alias))])
    for arg in ("from_", "from"):
        if select.args.get(arg):
            probe.set(arg, select.args[arg].copy())
    probe.set("joins", [j.copy() for j in select.args.get("joins") or []])
    return describe_in_scope(select, probe, schema_db)


def describe_in_scope(node: exp.Expr, probe: exp.Query, schema_db: SchemaDB) -> list[tuple[str, str]]:
    """(name, type) of ``probe``'s columns, bound where ``node`` is: with the CTEs in its scope."""
    levels: list[list[exp.CTE]] = []  # innermost first
    at: exp.Expr | None = node
    while at is not None:
        if ctes_of(at):
            levels.append(ctes_of(at))
        at = at.parent
    ctes: list[exp.CTE] = []
    named: set[str] = set()
    for level in levels:  # an inner CTE hides an outer one of its name
        ctes = [c for c in level if c.alias_or_name.lower() not in named] + ctes
        named |= {c.alias_or_name.lower() for c in level}
    sql = probe.sql(dialect="duckdb")
    if ctes:
        sql = f"WITH {', '.join(c.sql(dialect='duckdb') for c in ctes)} {sql}"
    return schema_db.describe(sql)
