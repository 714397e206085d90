"""Time travel in a query's text: ``t VERSION AS OF 3``, ``t TIMESTAMP AS OF '2024-05-01'`` (Delta's
and Spark's form, which DuckDB's parser does not read) and DuckDB's ``t [AS a] AT (VERSION => 3)``
/ ``AT (TIMESTAMP => ...)``. Found with sqlglot; each such reference becomes a table of its own
name (the version's, ingest/versions.py) aliased as the table, and the clause is cut from the text,
so the rest of the query reaches DuckDB's parser and the planner as written."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

from duckflock.errors import SqlError
from duckflock.sqltext import quote_ident, sql_literal


@dataclass(frozen=True)
class AsOf:
    table: str  # the name as written
    value: int | str  # a version or snapshot id; text: a timestamp
    node: exp.Table


@dataclass(frozen=True)
class References:
    tables: frozenset[str]  # lower-case names of the tables the query names (as they are now)
    as_of: tuple[AsOf, ...]


def references(text: str) -> References | None:
    """The tables a query reads and its time travel; None where sqlglot cannot parse it."""
    try:
        trees = sqlglot.parse(text, read="duckdb")
    except SqlglotError:
        return None
    plain: set[str] = set()
    found = []
    for t in (t for tree in trees if tree is not None for t in tree.find_all(exp.Table)):
        clause = t.args.get("version") or t.args.get("when")
        if clause is not None:
            found.append(AsOf(t.name, _value(t.name, clause), t))
        else:
            plain.add(t.name.lower())
    return References(frozenset(plain), tuple(found))


def _value(table: str, clause: exp.Expr) -> int | str:
    kind = str(clause.args.get("kind") if isinstance(clause, exp.HistoricalData) else clause.this).upper()
    value = clause.expression
    if isinstance(value, exp.Cast):  # AT (TIMESTAMP => TIMESTAMP '...')
        value = value.this
    if kind == "VERSION" and isinstance(value, exp.Literal) and value.is_int:
        return int(value.this)
    if kind == "TIMESTAMP" and isinstance(value, exp.Literal) and value.is_string:
        return str(value.this)
    wanted = "a version number" if kind == "VERSION" else "a timestamp in quotes"
    raise SqlError(f"{table} {kind} AS OF {value.sql('duckdb')}: give {wanted}")


def rewrite(text: str, as_of: tuple[AsOf, ...], names: list[str]) -> str:
    """The query with the i-th time-travel reference reading table ``names[i]``, aliased as written."""
    tokens = Dialect.get_or_raise("duckdb").tokenize(text)
    edits: list[tuple[int, int, str]] = []  # (start, end inclusive, replacement)
    for ref, name in zip(as_of, names, strict=True):
        t = ref.node
        first = t.args.get("catalog") or t.args.get("db") or t.this
        alias = t.args.get("alias")
        if isinstance(t.args.get("when"), exp.HistoricalData) and alias is not None:
            anchor = alias.this.meta["end"]  # DuckDB's AT comes after the alias
        else:
            anchor = t.this.meta["end"]
        edits.append((anchor + 1, _clause_end(tokens, anchor, ref.table), ""))  # with the space before
        renamed = quote_ident(name) + ("" if alias is not None else f" AS {t.this.sql('duckdb')}")
        edits.append((first.meta["start"], t.this.meta["end"], renamed))
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end + 1 :]
    return text


def _clause_end(tokens: list, anchor: int, table: str) -> int:
    """Where the time-travel clause after position ``anchor`` ends (inclusive)."""
    after = [tok for tok in tokens if tok.start > anchor]
    if after and after[0].text.upper() == "AT":  # AT ( ... ): to the matching parenthesis
        depth = 0
        for tok in after[1:]:
            depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(tok.token_type, 0)
            if depth == 0:
                return int(tok.end)
    else:  # [FOR] VERSION|TIMESTAMP AS OF <literal>
        for tok in after:
            if tok.token_type in (TokenType.NUMBER, TokenType.STRING):
                return int(tok.end)
    raise SqlError(f"cannot read the time travel clause of {table}")


def versions_given(pairs: list[str]) -> dict[str, int | str]:
    """``["t=3", "u=2025-05-01 12:00"]`` (``--at``) as ``pin`` takes them: a number is a version."""
    out: dict[str, int | str] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        value = value.strip().strip("'")
        if not eq or not name.strip() or not value:
            raise SqlError(f"--at {pair}: give TABLE=VERSION (or TABLE='timestamp')")
        out[name.strip()] = int(value) if value.isdigit() else value
    return out


def pin(text: str, versions: Mapping[str, int | str]) -> str:
    """The query with every reference to a table in ``versions`` (by name, any case) given that
    version: ``t`` -> ``t VERSION AS OF 3`` (a number), ``t TIMESTAMP AS OF '...'`` (text). A
    reference with a time-travel clause of its own keeps it; a CTE of that name is not a table."""
    if not versions:
        return text
    wanted = {name.lower(): value for name, value in versions.items()}
    try:
        trees = [t for t in sqlglot.parse(text, read="duckdb") if t is not None]
    except SqlglotError as e:
        raise SqlError(f"cannot read the query to give its tables versions: {e}") from None
    ctes = {c.alias_or_name.lower() for tree in trees for c in tree.find_all(exp.CTE)}
    found: set[str] = set()
    edits: list[tuple[int, str]] = []
    for t in (t for tree in trees for t in tree.find_all(exp.Table)):
        name = t.name.lower()
        if name not in wanted or name in ctes or t.args.get("db") or not isinstance(t.this, exp.Identifier):
            continue
        found.add(name)
        if t.args.get("version") is None and t.args.get("when") is None:
            value = wanted[name]
            kind = "VERSION" if isinstance(value, int) else "TIMESTAMP"
            clause = f"{kind} AS OF {sql_literal(value)}"
            edits.append((int(t.this.meta["end"]) + 1, " " + clause))
    missing = sorted(set(wanted) - found)
    if missing:
        raise SqlError(f"versions given for {', '.join(map(repr, missing))}, which the query does not read")
    for at, clause in sorted(edits, reverse=True):
        text = text[:at] + clause + text[at:]
    return text
