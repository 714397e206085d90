"""LIMIT and OFFSET beyond a constant count: a constant expression, a value a subquery computes, and
LIMIT ... PERCENT.

- A constant expression (``LIMIT 2.5``, ``LIMIT 1 + 1``) is folded here as DuckDB's binder folds it:
  cast to BIGINT (2.5 is 3), NULL being no limit (no offset).
- A value a subquery computes (``LIMIT (SELECT count(*) FROM u)``) is evaluated once, where the
  rows are counted, and read as DuckDB's LIMIT reads it: a DECIMAL through DOUBLE (2.5 is 2), any
  other type cast to UBIGINT (a negative one fails), NULL no limit, above 2^62 an error.
- ``LIMIT p PERCENT`` keeps floor(p / 100 * n) rows of the n (DuckDB's double arithmetic), after
  the offset.

Such a limit is a window and a filter: the rows are numbered in the query's order
(``row_number() OVER (ORDER BY ...)``, the whole input one window), those past the offset and
within the limit kept, and sorted again above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb
from sqlglot import exp

from duckflock.errors import SqlError
from duckflock.plan.nodes import Filter, Limit, Node, Project, Sort, Values, Window
from duckflock.sql.allowlist import unsupported
from duckflock.sqltext import quote_ident as q

if TYPE_CHECKING:
    from duckflock.sql.builder import Builder

_MAX = 4611686018427387904  # DuckDB's largest LIMIT / OFFSET


@dataclass(frozen=True)
class RowLimit:
    limit: int | None = None  # a constant count (None: no limit)
    offset: int = 0
    limit_sql: str | None = None  # a value computed at run time: SQL over subquery tokens
    offset_sql: str | None = None
    percent: str | None = None  # LIMIT ... PERCENT: the percentage, a number literal

    @property
    def constant(self) -> bool:
        return self.limit_sql is None and self.offset_sql is None and self.percent is None


def row_limit(query: exp.Query, builder: Builder) -> RowLimit:
    """The LIMIT and OFFSET of a SELECT or set operation."""
    limit, limit_sql, percent = _clause(query, "limit", builder)
    offset, offset_sql, _ = _clause(query, "offset", builder)
    return RowLimit(limit, offset or 0, limit_sql, offset_sql, percent)


def _clause(query: exp.Query, arg: str, builder: Builder) -> tuple[int | None, str | None, str | None]:
    """(constant, run-time SQL, percentage) of a LIMIT or OFFSET clause."""
    node = query.args.get(arg)
    if node is None:
        return None, None, None
    value = node.args.get("expression") or node.this
    options = node.args.get("limit_options")
    if options is not None and options.args.get("with_ties"):
        raise unsupported("LIMIT ... WITH TIES")
    if options is not None and options.args.get("percent"):
        if not isinstance(value, exp.Literal) or value.is_string:
            raise unsupported("LIMIT ... PERCENT of an expression")
        if not 0 <= float(value.this) <= 100:
            raise SqlError("Limit percent out of range, should be between 0% and 100%")
        return None, None, value.this
    if isinstance(value, exp.Literal) and value.is_int:
        return int(value.this), None, None
    if value.find(exp.Subquery, exp.Exists) is None:
        return _folded(value, builder), None, None
    return None, _run_time(builder.names(value.copy()), builder), None


def _folded(value: exp.Expr, builder: Builder) -> int | None:
    sql = value.sql(dialect="duckdb")
    try:
        rows = builder.schema_db.con.sql(f"SELECT CAST(({sql}) AS BIGINT)").fetchall()
    except duckdb.Error:  # DuckDB accepted it in the query: a rewrite it rejects here
        raise unsupported("non-constant LIMIT or OFFSET") from None
    return rows[0][0]


def _run_time(value: exp.Expr, builder: Builder) -> str:
    """The count DuckDB's LIMIT reads from a value: SQL of a UBIGINT, or NULL."""
    sql = value.sql(dialect="duckdb")
    probe = Project(("__v",), child=Values(("__one",)), exprs=(sql,), **builder.attach(sql))
    (typ,) = builder.node_types(probe)
    count = (
        f"CAST(CAST({sql} AS DOUBLE) AS UBIGINT)"
        if typ.upper().startswith("DECIMAL")
        else f"CAST({sql} AS UBIGINT)"
    )
    too_big = f"'Max value ' || {count} || ' for LIMIT/OFFSET is {_MAX}'"
    return f"(CASE WHEN {count} > {_MAX} THEN error({too_big}) ELSE {count} END)"


def limited(
    rel: Node, visible: tuple[str, ...], sort_keys: list[str], rows: RowLimit, builder: Builder
) -> Node:
    """``rel`` sorted by ``sort_keys`` (if any), the rows ``rows`` keeps, with columns ``visible``."""
    if rows.constant:
        if sort_keys:
            return Sort(visible, child=rel, keys=tuple(sort_keys), limit=rows.limit, offset=rows.offset)
        if rows.limit is not None or rows.offset:
            return Limit(rel.columns, child=rel, limit=rows.limit, offset=rows.offset)
        return rel
    number, total = builder.fresh("rn"), builder.fresh("rows")
    order = f"ORDER BY {', '.join(sort_keys)}" if sort_keys else ""
    exprs = [f"row_number() OVER ({order})"]
    if rows.percent is not None:
        exprs.append("count(*) OVER ()")
    names = (number, total)[: len(exprs)]
    rel = Window(rel.columns + names, child=rel, exprs=tuple(exprs))
    offset = f"COALESCE({rows.offset_sql}, 0)" if rows.offset_sql is not None else str(rows.offset)
    count = rows.limit_sql
    if rows.percent is not None:
        count = f"CAST(floor(CAST({rows.percent} AS DOUBLE) / 100 * {q(total)}) AS BIGINT)"
    elif count is None and rows.limit is not None:
        count = str(rows.limit)
    conditions = [f"{q(number)} > {offset}"]
    if count is not None:
        conditions.append(f"({count} IS NULL OR {q(number)} <= {offset} + {count})")
    condition = " AND ".join(conditions)
    rel = Filter(rel.columns, child=rel, condition=condition, **builder.attach(condition))
    if sort_keys:
        return Sort(visible, child=rel, keys=tuple(sort_keys))
    return Project(visible, child=rel, exprs=tuple(q(c) for c in visible))
