"""Prepared statements' ``?`` parameters, bound by writing each value into the query text as a
typed literal (duckflock plans the text of a query, and each rank runs SQL that the planner writes
from it; values cannot travel beside it).

Each value is written as DuckDB writes it, cast back to its own type (``CAST('1.5' AS
DECIMAL(4,1))``), so it reaches the query as the client sent it; only the placeholder tokens of
the text are replaced (a ``?`` inside a string or a comment is not one)."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.tokens import TokenType

from duckflock.errors import DuckflockError
from duckflock.sqltext import sql_literal


def placeholders(query: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of each ``?`` placeholder of ``query``, in order."""
    try:
        tokens = DuckDB().tokenize(query)
    except Exception as e:  # sqlglot's TokenError: unterminated string and the like
        raise DuckflockError(f"cannot read the query: {e}") from None
    return [(t.start, t.end + 1) for t in tokens if t.token_type == TokenType.PLACEHOLDER]


def literals(row: pa.Table) -> list[str]:
    """Each column of the one-row table ``row`` as a SQL literal of its DuckDB type; text as a plain
    string literal, which DuckDB types by where it stands (``2 * 3 > ?`` given '5' compares
    integers; a VARCHAR there is refused), as clients send a value as text where the parameter's
    type is not known (JDBC's setString)."""
    con = duckdb.connect()
    try:
        con.register("params", row.rename_columns([f"p{i}" for i in range(row.num_columns)]))
        exprs = ", ".join(f"CAST(p{i} AS VARCHAR), typeof(p{i})" for i in range(row.num_columns))
        values = con.execute(f"SELECT {exprs} FROM params").fetchone() if row.num_columns else ()
    finally:
        con.close()
    assert values is not None
    pairs = zip(values[0::2], values[1::2], strict=True)
    return [_literal(text, kind) for text, kind in pairs]


def _literal(text: str | None, kind: str) -> str:
    if text is not None and kind == "VARCHAR":
        return sql_literal(text)
    return f"CAST({'NULL' if text is None else sql_literal(text)} AS {kind})"


def bind_nulls(query: str) -> str:
    """``query`` with NULL for each placeholder: its result's schema where no values are bound."""
    return _replaced(query, ["NULL"] * len(placeholders(query)))


def _replaced(query: str, values: list[str]) -> str:
    parts, at = [], 0
    for (start, end), value in zip(placeholders(query), values, strict=True):
        parts += [query[at:start], value]
        at = end
    return "".join([*parts, query[at:]])


def check_count(query: str, bound: int) -> None:
    """Refuse ``bound`` values for a query whose number of placeholders differs."""
    n = len(placeholders(query))
    if bound != n:
        raise DuckflockError(
            f"the query has {n} parameter{'' if n == 1 else 's'} (?), "
            f"{bound} {'value was' if bound == 1 else 'values were'} bound"
        )


# Predicates whose operands take one type: a parameter there has its other operand's type.
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.Like, exp.ILike)


def parameter_types(query: str, column_types: dict[str, str]) -> list[str | None]:
    """The DuckDB type each placeholder takes, where the query says: the column it is compared
    with (``col = ?``, ``col IN (?, ?)``, ``col BETWEEN ? AND ?``; ``column_types``: lower-case
    column name -> type) or its cast (``CAST(? AS DATE)``); None where it does not. Clients that
    bind by the declared types (JDBC) need them: DuckDB's own prepared statements leave them open
    until values come."""
    spots = placeholders(query)
    numbered = _replaced(query, [f"${i}" for i in range(1, len(spots) + 1)])
    try:
        tree = sqlglot.parse_one(numbered, read="duckdb")
    except sqlglot.errors.ParseError:
        return [None] * len(spots)  # the query's own error comes when it runs
    types: list[str | None] = [None] * len(spots)
    for p in tree.find_all(exp.Placeholder):
        if str(p.this).isdigit() and 1 <= int(p.this) <= len(spots):
            types[int(p.this) - 1] = _type_of(p, column_types)
    return types


def _type_of(p: exp.Placeholder, column_types: dict[str, str]) -> str | None:
    parent = p.parent
    if isinstance(parent, exp.Cast):
        return parent.to.sql(dialect="duckdb")
    other: exp.Expression | None = None
    if isinstance(parent, _COMPARISONS):
        other = parent.expression if parent.this is p else parent.this
    elif isinstance(parent, exp.In | exp.Between) and parent.this is not p:
        other = parent.this
    if isinstance(other, exp.Column):
        return column_types.get(other.name.lower())
    return None


def parameter_schema(types: list[str | None]) -> pa.Schema:
    """Arrow fields "1", "2", ... of the DuckDB types (text where unknown)."""
    if not types:
        return pa.schema([])
    con = duckdb.connect()
    try:
        exprs = ", ".join(f'CAST(NULL AS {t or "VARCHAR"}) AS "{i}"' for i, t in enumerate(types, 1))
        return con.sql(f"SELECT {exprs}").to_arrow_table().schema
    finally:
        con.close()


def bind(query: str, params: pa.Table) -> list[str]:
    """``query`` with its placeholders replaced by the values of each row of ``params`` (one query
    per row). The number of columns must be the number of placeholders."""
    check_count(query, params.num_columns)
    return [_replaced(query, literals(params.slice(i, 1))) for i in range(params.num_rows)]
