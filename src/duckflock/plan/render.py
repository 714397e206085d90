"""Render a plan subtree as one DuckDB query. With ``sql_text`` (the fragments around a stage's
query), the only place that writes SQL text for DuckDB.

Each node becomes a SELECT over its children's SELECTs; DuckDB flattens the nesting and optimizes the
whole stage as one query (join order, filter and projection pushdown into the Parquet scan).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import singledispatch

from duckflock.plan.kinds import JoinKind, SetOpKind
from duckflock.plan.nodes import (
    AdaptiveJoin,
    Aggregate,
    Distinct,
    DriverQuery,
    Exchange,
    ExchangeRead,
    Filter,
    FunctionScan,
    Join,
    Limit,
    Node,
    Project,
    Scan,
    SetOp,
    Sort,
    Values,
    Window,
)
from duckflock.sqltext import quote_ident as q

# How a Scan is turned into a relation: (scan) -> SQL of a FROM item with the table's source columns.
ScanSource = Callable[[Scan], str]


def exchange_table(xid: int) -> str:
    return f"__x{xid}"


def render(node: Node, source: ScanSource) -> str:
    return _render(node, source)


@singledispatch
def _render(node: Node, source: ScanSource) -> str:
    raise TypeError(f"cannot render {type(node).__name__}")


def _sub(node: Node, source: ScanSource) -> str:
    return f"({_render(node, source)})"


@_render.register
def _(node: Scan, source: ScanSource) -> str:
    cols = ", ".join(f"{q(s)} AS {q(c)}" for s, c in zip(node.source_columns, node.columns, strict=True))
    sql = f"SELECT {cols or 'NULL AS __none'} FROM {source(node)}"
    if node.filter:
        sql = f"SELECT * FROM ({sql}) WHERE {node.filter}"
    return sql


@_render.register
def _(node: FunctionScan, source: ScanSource) -> str:
    aliases = ", ".join(q(c) for c in node.source_columns)
    cols = ", ".join(f"{q(s)} AS {q(c)}" for s, c in zip(node.source_columns, node.columns, strict=True))
    return f"SELECT {cols} FROM {node.function} AS __f({aliases})"


@_render.register
def _(node: Values, source: ScanSource) -> str:
    return "SELECT 1 AS __one"


@_render.register
def _(node: DriverQuery, source: ScanSource) -> str:
    # Each table the text names is a CTE of that name around it: DuckDB binds the text as written.
    # (To run it, the stage makes them views instead: exec/stages/stage.py.)
    tables = ", ".join(f"{q(name)} AS {_sub(child, source)}" for name, child in node.inputs)
    with_ = f"WITH {tables} " if tables else ""
    return f"{with_}{driver_sql(node)}"


def driver_sql(node: DriverQuery) -> str:
    """The user's text, its columns named as the plan names them."""
    return f"SELECT * FROM ({node.sql}) AS __driver({', '.join(q(c) for c in node.columns)})"


@_render.register
def _(node: ExchangeRead, source: ScanSource) -> str:
    return f"SELECT * FROM {exchange_table(node.xid)}"


@_render.register
def _(node: AdaptiveJoin, source: ScanSource) -> str:
    # Both plans give the same rows; stages resolve the choice before rendering (exec/stages/adaptive.py).
    return _render(node.broadcast, source)


@_render.register
def _(node: Exchange, source: ScanSource) -> str:
    # Removing exchanges leaves the single-node plan: an exchange renders as its child.
    return _render(node.child, source)


def _with_subqueries(sql: str, node: Filter | Project, source: ScanSource) -> str:
    for token, sub in node.subqueries:
        sql = sql.replace(q(token), f"{_sub(sub, source)} AS {q(token)}")
    return sql


@_render.register
def _(node: Filter, source: ScanSource) -> str:
    return f"SELECT * FROM {_sub(node.child, source)} WHERE {_with_subqueries(node.condition, node, source)}"


@_render.register
def _(node: Project, source: ScanSource) -> str:
    items = ", ".join(f"{e} AS {q(c)}" for e, c in zip(node.exprs, node.columns, strict=True))
    return f"SELECT {_with_subqueries(items, node, source)} FROM {_sub(node.child, source)}"


_JOIN_SQL = {
    JoinKind.INNER: "JOIN",
    JoinKind.LEFT: "LEFT JOIN",
    JoinKind.RIGHT: "RIGHT JOIN",
    JoinKind.FULL: "FULL JOIN",
    JoinKind.SEMI: "SEMI JOIN",
    JoinKind.ANTI: "ANTI JOIN",
    JoinKind.CROSS: "CROSS JOIN",
    JoinKind.ASOF: "ASOF JOIN",
    JoinKind.ASOF_LEFT: "ASOF LEFT JOIN",
}
_SET_OP_SQL = {SetOpKind.UNION: "UNION", SetOpKind.INTERSECT: "INTERSECT", SetOpKind.EXCEPT: "EXCEPT"}


@_render.register
def _(node: Join, source: ScanSource) -> str:
    on = f" ON {node.condition}" if node.condition and node.kind is not JoinKind.CROSS else ""
    cols = ", ".join(q(c) for c in node.columns)
    return (
        f"SELECT {cols} FROM {_sub(node.left, source)} AS __l "
        f"{_JOIN_SQL[node.kind]}{' LATERAL' if node.lateral else ''} {_sub(node.right, source)} AS __r{on}"
    )


@_render.register
def _(node: Aggregate, source: ScanSource) -> str:
    items = ", ".join(f"{e} AS {q(c)}" for e, c in zip(node.groups + node.aggs, node.columns, strict=True))
    by = node.group_by_sql()
    group = f" GROUP BY {by}" if by else ""
    return f"SELECT {items} FROM {_sub(node.child, source)}{group}"


@_render.register
def _(node: Window, source: ScanSource) -> str:
    child = node.child.columns
    items = [q(c) for c in child] + [
        f"{e} AS {q(c)}" for e, c in zip(node.exprs, node.columns[len(child) :], strict=True)
    ]
    return f"SELECT {', '.join(items)} FROM {_sub(node.child, source)}"


@_render.register
def _(node: SetOp, source: ScanSource) -> str:
    op = _SET_OP_SQL[node.kind] + (" ALL" if node.all else "")
    names = ", ".join(q(c) for c in node.columns)
    left = f"SELECT * FROM {_sub(node.left, source)}"
    right = f"SELECT * FROM {_sub(node.right, source)}"
    return f"SELECT * FROM ({left} {op} {right}) AS __set({names})"


@_render.register
def _(node: Distinct, source: ScanSource) -> str:
    return f"SELECT DISTINCT * FROM {_sub(node.child, source)}"


def _limit(limit: int | None, offset: int) -> str:
    sql = f" LIMIT {limit}" if limit is not None else ""
    return sql + (f" OFFSET {offset}" if offset else "")


@_render.register
def _(node: Sort, source: ScanSource) -> str:
    # The sort selects its output columns itself: an ORDER BY below a projection is not kept.
    cols = ", ".join(q(c) for c in node.columns)
    return f"SELECT {cols} FROM {_sub(node.child, source)} ORDER BY {', '.join(node.keys)}" + _limit(
        node.limit, node.offset
    )


@_render.register
def _(node: Limit, source: ScanSource) -> str:
    return f"SELECT * FROM {_sub(node.child, source)}" + _limit(node.limit, node.offset)
