"""Refuse every construct the planner does not handle, instead of dropping it.

The binder maps a parsed tree onto plan nodes clause by clause; a clause it does not read would be
silently ignored (``LIMIT 40 PERCENT`` returned every row before sql/row_limits.py read it). So
before binding, every node of the tree is checked: clause-carrying nodes may only have the
arguments listed here, and node kinds that are never distributed are refused by name. A construct
nobody thought of is refused, never dropped. Expressions (operators, scalar functions, casts, ...)
are rendered back to DuckDB SQL verbatim and evaluated by DuckDB, so they need no list.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from sqlglot import exp

from duckflock.errors import NotDistributed
from duckflock.sql.functions import function_name
from duckflock.sql.scopes import query_of

if TYPE_CHECKING:
    from duckflock.catalog import Catalog

# Node kind -> the arguments the binder reads. Any other argument that is set is refused.
_CLAUSE_ARGS: dict[type, set[str]] = {
    exp.Select: {
        "expressions",
        "from_",
        "from",
        "joins",
        "where",
        "group",
        "having",
        "order",
        "limit",
        "offset",
        "distinct",
        "with_",
        "with",
        "windows",
        "qualify",
    },
    exp.Union: {"this", "expression", "distinct", "by_name", "order", "limit", "offset", "with_", "with"},
    exp.Intersect: {"this", "expression", "distinct", "by_name", "order", "limit", "offset", "with_", "with"},
    exp.Except: {"this", "expression", "distinct", "by_name", "order", "limit", "offset", "with_", "with"},
    exp.From: {"this"},
    exp.Join: {"this", "on", "side", "kind", "using", "method"},
    exp.Table: {"this", "alias", "db", "catalog"},
    exp.Subquery: {"this", "alias"},
    exp.TableAlias: {"this", "columns"},
    exp.Where: {"this"},
    exp.Having: {"this"},
    exp.Qualify: {"this"},
    exp.Group: {"expressions", "all"},
    exp.Order: {"this", "expressions"},
    exp.Ordered: {"this", "desc", "nulls_first"},
    exp.Limit: {"this", "expression", "limit_options"},  # PERCENT, WITH TIES: sql/row_limits.py
    exp.Offset: {"this", "expression"},
    exp.Distinct: {"expressions"},
    exp.With: {"expressions"},
    exp.CTE: {"this", "alias", "materialized"},
    exp.Window: {"this", "partition_by", "order", "spec", "alias", "over"},
    exp.WindowSpec: {"kind", "start", "start_side", "end", "end_side", "exclude"},
}

# How a refused argument is named to the user.
_ARG_NAMES = {
    "method": "{value} JOIN",
    "match_condition": "ASOF JOIN",
    "rollup": "ROLLUP",
    "cube": "CUBE",
    "grouping_sets": "GROUPING SETS",
    "totals": "WITH TOTALS",
    "on": "DISTINCT ON",
    "recursive": "WITH RECURSIVE",
    "sample": "USING SAMPLE / TABLESAMPLE",
    "pivots": "PIVOT / UNPIVOT",
    "laterals": "LATERAL",
    "joins": "parenthesized joins",
    "with_fill": "ORDER BY ... WITH FILL",
}

_REFUSED_KINDS: dict[type, str] = {
    exp.Unnest: "UNNEST",
    exp.Pivot: "PIVOT / UNPIVOT",
    exp.TableSample: "USING SAMPLE / TABLESAMPLE",
    exp.Placeholder: "query parameters",
    exp.Into: "SELECT ... INTO",
    exp.MatchRecognize: "MATCH_RECOGNIZE",
    exp.Connect: "CONNECT BY",
    exp.PreWhere: "PREWHERE",
    # Rows are hashed, grouped, compared and sorted by their bytes between ranks: a collation
    # would be honoured inside each rank's DuckDB only.
    exp.Collate: "COLLATE",
    # Its patterns would match the unique names columns get here ("t.id"), not the query's.
    exp.Columns: "COLUMNS(...)",
    # A position in the FROM clause's columns: the binder narrows what each FROM item reads.
    exp.PositionalColumn: "positional column references (#n)",
}


# Subquery.meta key of a parenthesized join kept for sqlglot to qualify (sql/join_groups.py): its
# first item holds the joins.
KEPT_GROUP = "join_group"


def unsupported(what: str, construct: str | None = None) -> NotDistributed:
    """The refusal of a construct not distributed yet: ``what`` for the user, ``construct`` its
    name without the query's own names or values (default: ``what``)."""
    return NotDistributed(f"unsupported SQL construct: {what}", construct or what)


# Functions whose result type is written as text in an argument: ``from_json(j, '"ENUM(''a'')"')``.
_TYPE_FROM_TEXT = {"from_json", "from_json_strict", "json_transform", "json_transform_strict"}
_MAKE_TUPLES = {"row", "list_zip", "array_zip"}  # unnamed STRUCTs, or lists of them
# Where (a, b) is written without making a value: compared, a row of VALUES, a grouping set.
_TUPLE_IS_NO_VALUE = (exp.Predicate, exp.Values, exp.Group, exp.GroupingSets, exp.Cube, exp.Rollup)
_ENUM_TYPE = re.compile(r"\bENUM\s*\(", re.IGNORECASE)


def _makes_enum(node: exp.Expr) -> bool:
    if isinstance(node, exp.DataType):
        return node.this == exp.DataType.Type.ENUM
    if not isinstance(node, exp.Func):
        return False
    name = function_name(node)
    if name == "union_tag":  # an ENUM of the union's tags
        return True
    if name not in _TYPE_FROM_TEXT:
        return False
    # The type text is the last argument: from_json(j, '...') or an anonymous json_transform(j, '...').
    args = node.expressions or [node.args.get("this"), node.args.get("expression")]
    structure = args[-1]
    return isinstance(structure, exp.Expr) and any(
        isinstance(lit, exp.Literal) and lit.is_string and _ENUM_TYPE.search(lit.this) is not None
        for lit in structure.walk()
    )


def _check_values(node: exp.Expr) -> None:
    """Values another rank's DuckDB would read back from Arrow as another type."""
    if (isinstance(node, exp.DataType) and node.this == exp.DataType.Type.VARIANT) or (
        isinstance(node, exp.Func) and (function_name(node) or "").startswith("variant_")
    ):
        # DuckDB's Arrow form of a VARIANT narrows its inner types (UTINYINT to INT16).
        raise unsupported("VARIANT values")
    if _makes_enum(node):
        # Arrow carries an ENUM as a dictionary of strings: after an exchange it would sort and
        # compare as VARCHAR, not in the ENUM's order.
        raise unsupported("ENUM values")
    # An unnamed STRUCT, row(a, b) or (a, b) as a value: after an exchange its fields are named
    # (element1, ...), so it prints, and is indexed, as another value.
    if (isinstance(node, exp.Func) and function_name(node) in _MAKE_TUPLES) or (
        isinstance(node, exp.Tuple) and not isinstance(node.parent, _TUPLE_IS_NO_VALUE)
    ):
        raise unsupported("unnamed STRUCT values (row(a, b), (a, b), list_zip())")


def check_supported(tree: exp.Expr) -> None:
    """Raise SqlError naming the first construct of ``tree`` that duckflock does not distribute."""
    for node in tree.walk():
        for kind, name in _REFUSED_KINDS.items():
            if isinstance(node, kind):
                raise unsupported(name)
        if isinstance(node, exp.Values) and not isinstance(node.parent, exp.From | exp.Join):
            raise unsupported("VALUES other than a FROM item")
        if isinstance(node, exp.Lateral):
            _check_lateral(node)
        _check_names(node)
        _check_values(node)
        _check_args(node)
        if isinstance(node, exp.Join):
            _check_join(node)
        if isinstance(node, exp.Select):
            _check_comma_precedence(node)
            _check_replace_with_using(node)
            _check_star_renames_sorted(node)
            _check_group_all_having(node)
        if isinstance(node, exp.Table) and not isinstance(node.this, exp.Identifier | exp.Func):
            raise unsupported(f"{node.this.key.upper()} in FROM")


def _check_args(node: exp.Expr) -> None:
    allowed = _CLAUSE_ARGS.get(type(node))
    if allowed is None:
        return
    if isinstance(node.parent, exp.Subquery) and node.parent.meta.get(KEPT_GROUP):
        allowed = allowed | {"joins"}  # a parenthesized join's first item
    for arg, value in node.args.items():
        if arg not in allowed and value is not None and value is not False and value != []:
            raise unsupported(_describe(node, arg, value))


def _check_comma_precedence(select: exp.Select) -> None:
    """``FROM a, b RIGHT JOIN c``: a comma binds after every JOIN, so this is
    a CROSS JOIN (b RIGHT JOIN c), but sqlglot lists the joins flat, as (a CROSS JOIN b) RIGHT JOIN c;
    for RIGHT and FULL joins the two differ (a's rows are NULL-extended or lost). Other joins after
    a comma give the same rows."""
    comma = False
    for j in select.args.get("joins") or []:
        if comma and (j.side or "").upper() in ("RIGHT", "FULL"):
            raise unsupported("a RIGHT or FULL JOIN after a comma in FROM")
        comma = comma or not any(j.args.get(k) for k in ("kind", "side", "on", "using", "method"))


def _check_replace_with_using(select: exp.Select) -> None:
    """sqlglot's star expansion drops a ``* REPLACE`` of a column merged by ``USING``."""
    if any(j.args.get("using") for j in select.args.get("joins") or []) and any(
        s.args.get("replace") for s in select.find_all(exp.Star) if query_of(s) is select
    ):
        raise unsupported("* REPLACE in a query joining with USING")


def _check_star_renames_sorted(select: exp.Select) -> None:
    """sqlglot resolves ``ORDER BY b`` after ``* REPLACE (-b AS b)`` or ``* RENAME`` to the input
    column, DuckDB to the output one."""
    stars = [s for s in select.find_all(exp.Star) if query_of(s) is select]
    if select.args.get("order") and any(s.args.get("replace") or s.args.get("rename") for s in stars):
        raise unsupported("ORDER BY in a query with * REPLACE or * RENAME")


def _check_group_all_having(select: exp.Select) -> None:
    """DuckDB's GROUP BY ALL also groups by the columns its HAVING reads outside aggregates."""
    group, having = select.args.get("group"), select.args.get("having")
    if group is None or having is None or not group.args.get("all"):
        return
    for column in having.find_all(exp.Column):
        if not isinstance(column.find_ancestor(exp.AggFunc, exp.Select), exp.AggFunc):
            raise unsupported("GROUP BY ALL with a HAVING that reads a column outside an aggregate")


def _check_names(node: exp.Expr) -> None:
    """Constructs naming columns in ways the binder's unique column names ("t.id") would break."""
    if isinstance(node, exp.Like | exp.ILike | exp.SimilarTo | exp.Glob) and isinstance(node.this, exp.Star):
        raise unsupported("* with a pattern on column names")
    if isinstance(node, exp.Rollup | exp.Cube | exp.GroupingSets):
        items = [i for e in node.expressions for i in (e.expressions if isinstance(e, exp.Tuple) else [e])]
        if any(isinstance(i.unnest(), exp.Literal) and i.unnest().is_int for i in items):
            raise unsupported("column positions in ROLLUP, CUBE or GROUPING SETS")
    # A dot in a FROM item's name: "x.y" with column v and x with column "y.v" would both be "x.y.v"
    # (with no dot there, the first dot of such a name ends the item's).
    if isinstance(node, exp.Table | exp.Subquery | exp.CTE) and "." in node.alias_or_name:
        raise unsupported("a table, alias or CTE name with a dot in it")


def _check_lateral(lateral: exp.Lateral) -> None:
    """Only a joined LATERAL subquery is planned; LATERAL VIEW, functions and CROSS APPLY are not."""
    extra = [a for a in ("view", "outer", "cross_apply", "ordinality") if lateral.args.get(a)]
    if extra or not isinstance(lateral.this, exp.Subquery) or not isinstance(lateral.parent, exp.Join):
        raise unsupported("LATERAL other than a joined subquery")


def _check_join(join: exp.Join) -> None:
    kind = (join.args.get("kind") or "").upper()
    if kind not in ("", "INNER", "OUTER", "CROSS", "SEMI", "ANTI"):
        raise unsupported(f"{kind} JOIN")
    method = (join.args.get("method") or "").upper()
    if method and method != "ASOF":
        raise unsupported(f"{method} JOIN")
    # ASOF SEMI / ANTI joins and ASOF ... USING are rewritten before (sql/asof_forms.py).
    if method == "ASOF" and ((join.args.get("side") or "").upper() not in ("", "LEFT") or kind):
        what = f"ASOF {join.args.get('side') or kind} JOIN"
        raise unsupported(f"{what} ... USING" if join.args.get("using") else what)


def _describe(node: exp.Expr, arg: str, value: object) -> str:
    name = _ARG_NAMES.get(arg)
    if name is not None:
        text = value.sql(dialect="duckdb") if isinstance(value, exp.Expr) else str(value)
        return name.format(value=text.upper())
    return f"{arg.upper().replace('_', ' ')} in {node.key.upper()}"


def check_struct_names(tree: exp.Expr, catalog: Catalog) -> None:
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
