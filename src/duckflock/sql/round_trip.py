"""Does sqlglot write the query's function calls and casts back as DuckDB parsed them?

Every expression reaches the ranks as SQL that sqlglot re-wrote. Its DuckDB dialect maps some
functions onto others with different meaning (``jaro_winkler_similarity(a, b, cutoff)`` came back as
a case-insensitive two-argument call), and it reads a typed literal cast again
(``DATE '2024-10-01'::VARCHAR``) as the literal's type cast last: ``CAST(CAST('2024-10-01' AS
TEXT) AS DATE)``. DuckDB's own parser is the judge: the function calls it sees in the query as
written and in sqlglot's rewrite must be the same (names up to DuckDB's aliases, argument counts,
DISTINCT, FILTER, ORDER BY), and so must the casts of casts (both types, in their order). Where
they differ the query is not distributed; it runs as written on the driver, or is refused.
"""

from __future__ import annotations

import json
import logging
from collections import Counter

import duckdb
from sqlglot import exp
from sqlglot.errors import SqlglotError

from duckflock.sql.allowlist import unsupported

# Functions whose value is not a function of the row: the expression's own name, storage
# statistics, settings and variables of the user's session (each rank has its own).
CONTEXT_FUNCTIONS = frozenset({"alias", "stats", "current_setting", "getvariable"})

Call = tuple[str, int, bool, bool, int]


class _RoundTripWarnings(logging.Filter):
    """sqlglot warns that it cannot transpile APPROX_TOP_K to DuckDB (other dialects' versions
    return other types) and writes the call as read, which is right from DuckDB to DuckDB, and which
    the check here confirms. Said on every such query, the warning would only confuse."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("APPROX_TOP_K cannot be transpiled to DuckDB")


logging.getLogger("sqlglot").addFilter(_RoundTripWarnings())


# Rewrites sqlglot makes that DuckDB evaluates identically (checked value by value): (name, argument
# count) as written -> as re-written.
EQUIVALENT = {
    ("range", 1): ("range", 2),  # range(n) -> range(0, n)
    ("generate_series", 1): ("generate_series", 2),
    ("list_has_any", 2): ("&&", 2),
    ("log10", 1): ("log", 2),  # log(10, x) is log10(x) bit for bit; log(2, x) is not log2(x)
    ("string_agg", 1): ("string_agg", 2),  # string_agg(s) -> LISTAGG(s, ','): DuckDB's default separator
}


def check_round_trip(
    con: duckdb.DuckDBPyConnection,
    aliases: dict[str, str],
    text: str,
    tree: exp.Expr,
    type_aliases: dict[str, str] | None = None,
) -> None:
    """Raise SqlError (unsupported) when sqlglot's DuckDB SQL for ``tree`` calls other functions
    than ``text`` does, or calls a function whose value depends on where it runs."""
    try:
        again = tree.sql(dialect="duckdb")
    except SqlglotError as e:  # e.g. a call it parsed but cannot write back (encode(s))
        why = (str(e).splitlines() or [type(e).__name__])[0]
        raise unsupported(
            f"SQL the rewriter cannot write back ({why})", "SQL the rewriter cannot write back"
        ) from None
    # Both statements in one DuckDB query: each query costs about a millisecond of overhead.
    both = con.execute("SELECT json_serialize_sql(?), json_serialize_sql(?)", [text, again])
    written, rewritten = (
        _calls(serialized, aliases, type_aliases or {}) for serialized in both.fetchall()[0]
    )
    if written is None:
        return  # DuckDB cannot serialize this statement; its binder has accepted it already
    for name, *_ in written:
        if name in CONTEXT_FUNCTIONS:
            raise unsupported(
                f"{name}() (its value depends on where it runs)",
                "a function whose value depends on where it runs",
            )
    if rewritten is None:
        return
    expected = Counter({_equivalent(c): n for c, n in written.items()})
    got = Counter({_equivalent(c): n for c, n in rewritten.items()})
    if got != expected:  # numbers written otherwise (1_000 as 1000) may still be of the same type
        expected, got = _number_types(con, expected), _number_types(con, got)
    if got != expected:
        changed = sorted({c[0] for c in (written - rewritten) + (rewritten - written)})
        raise unsupported(
            f"function calls, casts or numbers the SQL rewriter would change: {', '.join(changed)}",
            "function calls, casts or numbers the SQL rewriter would change",
        )


def _number_types(con: duckdb.DuckDBPyConnection, calls: Counter[Call]) -> Counter[Call]:
    """``calls`` with each number counted by its DuckDB type instead of its text."""
    numbers = [c for c in calls if c[0].startswith(_NUMBER)]
    if not numbers:
        return calls
    texts = [c[0].removeprefix(_NUMBER) for c in numbers]
    types = con.execute(f"SELECT {', '.join(f'typeof({t})' for t in texts)}").fetchall()[0]
    out = calls.copy()
    for call, typ in zip(numbers, types, strict=True):
        n = out.pop(call)
        out[(f"a number of type {typ}", *call[1:])] += n
    return out


def _equivalent(call: Call) -> Call:
    name, args, distinct, filtered, orders = call
    name, args = EQUIVALENT.get((name, args), (name, args))
    return (name, args, distinct, filtered, orders)


_NUMBER = "the number "


def _calls(serialized: str, aliases: dict[str, str], types: dict[str, str]) -> Counter[Call] | None:
    """The function calls and casts in a statement DuckDB serialized (``json_serialize_sql``)."""
    out: Counter[Call] = Counter()

    def count(node: dict) -> dict:  # called for every JSON object as it is parsed
        child = node.get("child")
        if node.get("class") == "CAST" and isinstance(child, dict) and child.get("class") == "CAST":
            # A cast of a cast (a typed literal cast again): the order of the two types. sqlglot
            # adds lone casts DuckDB reads alike (bool_or(x) as bool_or(CAST(x AS BOOLEAN))).
            cast = f"CAST AS {_type(node.get('type_expr'), types)} OF {_type(child.get('type_expr'), types)}"
            out[(cast, 1, bool(node.get("try_cast")), False, 0)] += 1
        literal = node.get("literal") if node.get("class") == "CONSTANT" else None
        if isinstance(literal, dict) and literal.get("kind") == "NUMERIC":
            # A number's type is read from its text: sqlglot writes .5 as 0.5, DECIMAL(2,1)
            # where DuckDB reads DECIMAL(1,1) (another typeof(), another text when cast).
            out[(f"{_NUMBER}{literal.get('text')}", 0, False, False, 0)] += 1
        if node.get("class") == "FUNCTION":
            name = str(node.get("function_name", "")).lower()
            orders = (node.get("order_bys") or {}).get("orders") or []
            args = len(node.get("arguments") or [])
            out[
                (
                    aliases.get(name, name),
                    args,
                    bool(node.get("distinct")),
                    node.get("filter") is not None,
                    len(orders),
                )
            ] += 1
        return node

    if json.loads(serialized, object_hook=count).get("error"):
        return None
    return out


def _type(node: dict | None, types: dict[str, str]) -> str:
    """A cast's type as DuckDB parsed it, its name up to DuckDB's aliases (TEXT is VARCHAR)."""
    if not isinstance(node, dict):
        return "?"
    name = str(node.get("type_name", "?"))
    name = types.get(name.lower(), name).upper()
    params = []
    for child in node.get("children") or []:
        literal = child.get("literal") if isinstance(child, dict) else None
        params.append(str(literal.get("text")) if isinstance(literal, dict) else _type(child, types))
    return f"{name}({','.join(params)})" if params else name
