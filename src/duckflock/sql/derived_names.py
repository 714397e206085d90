"""Output names of derived tables and CTEs made unique as DuckDB makes them.

DuckDB renames a repeated output name of a subquery in FROM or a CTE (compared case-insensitively)
to ``name_1``, ``name_2``, ... (a name already taken gets another suffix: ``k_1_1``), so that
``SELECT k FROM (SELECT x AS k, y AS k)`` reads ``x``. sqlglot would resolve ``k`` to the last
``k``. Writing the unique names into the FROM item's column list gives both the same reading.
"""

from __future__ import annotations

import re
import string
from typing import Any

from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.qualify import qualify

from duckflock.sql.allowlist import unsupported

_TAG = "derived_names"
_UNNAMED = "derived_names_unnamed"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def unique_derived_names(tree: exp.Expr, schema: dict[str, Any]) -> exp.Expr:
    items: list[exp.Expr] = [
        n
        for n in tree.find_all(exp.Subquery, exp.CTE)
        if isinstance(n, exp.CTE) or isinstance(n.parent, exp.From | exp.Join)
    ]
    tagged = [p for i in items for p in _first_select(i).expressions if _unnamed(p)]
    for p in tagged:
        p.meta[_UNNAMED] = True
    try:
        starred = [i for i in items if any(p.is_star for p in _first_select(i).expressions)]
        expanded = _expanded_names(tree, starred, schema) if starred else {}
        position = {id(item): n for n, item in enumerate(starred)}
        for item in items:
            if id(item) in position:
                names = expanded.get(position[id(item)])
            else:
                names = [_names(p) for p in _first_select(item).expressions]
            if names is not None:
                _rename(item, names)
    finally:
        for p in tagged:
            p.meta.pop(_UNNAMED, None)
    return tree


def _unnamed(p: exp.Expr) -> bool:
    """DuckDB names such a column by its rendering ('s', CAST(x AS BOOLEAN), (x + 1)), where
    sqlglot names a literal by its text and a cast by the column inside."""
    return not isinstance(p, exp.Alias | exp.Column) and not p.is_star


def _names(p: exp.Expr) -> tuple[str, str]:
    """(DuckDB's name of a column, "" where it is unnamed; sqlglot's name of it)."""
    inner = p.this if isinstance(p, exp.Alias) else p
    unnamed = p.meta.get(_UNNAMED) or (isinstance(inner, exp.Expr) and inner.meta.get(_UNNAMED))
    return ("" if unnamed else p.alias_or_name), p.alias_or_name


def duckdb_unique(names: list[str]) -> list[str]:
    """DuckDB's renaming of repeated column names (QueryResult::DeduplicateColumns): case folded
    in ASCII only, as DuckDB folds it ("É" and "é" are two names)."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        low = _fold(name)
        if low not in seen:
            seen[low] = 1
            out.append(name)
            continue
        new = f"{name}_{seen[low]}"
        while _fold(new) in seen:
            seen[low] += 1
            new = f"{name}_{seen[low]}"
        seen[_fold(new)] = 1
        out.append(new)
    return out


def _fold(name: str) -> str:
    return name.translate(_ASCII_LOWER)


def _first_select(item: exp.Expr) -> exp.Select:
    """The SELECT naming a FROM item's columns (a set operation's first branch)."""
    body = item.this
    while not isinstance(body, exp.Select):
        if not isinstance(body, exp.Subquery | exp.SetOperation):
            return exp.Select()
        body = body.this
    return body


def _expanded_names(
    tree: exp.Expr, starred: list[exp.Expr], schema: dict[str, Any]
) -> dict[int, list[tuple[str, str]]]:
    """The output names of FROM items whose SELECT has a star, read off a qualified copy of the
    query (sqlglot expands stars there, keeping repeated names); keyed by position in ``starred``."""
    for i, item in enumerate(starred):
        item.meta[_TAG] = i
    try:
        copy = qualify(tree.copy(), schema=schema, dialect="duckdb", validate_qualify_columns=False)
    except SqlglotError:
        return {}  # the query's own qualification fails alike: it is refused there
    finally:
        for item in starred:
            item.meta.pop(_TAG, None)
    found = {}
    for node in copy.find_all(exp.Subquery, exp.CTE):
        if _TAG in node.meta:
            found[node.meta[_TAG]] = [_names(p) for p in _first_select(node).expressions]
    return found


def _rename(item: exp.Expr, named: list[tuple[str, str]]) -> None:
    alias = item.args.get("alias")
    given = [c.name for c in alias.args.get("columns") or []] if isinstance(alias, exp.TableAlias) else []
    names = given + [n for n, _ in named[len(given) :]]
    known = {_fold(n) for n in names if n}
    own = named[len(given) :]
    if any(not n and theirs and _fold(theirs) in known for n, theirs in own):
        raise unsupported("a derived table's unnamed column that sqlglot names like one of its columns")
    if any(not n for n, _ in own) and any(n and not _IDENTIFIER.fullmatch(n) for n in names):
        # DuckDB's name of the unnamed one, "(x + 1)", may be taken by the other: not worked out here.
        raise unsupported("a derived table with an unnamed column and a column named like an expression")
    # An unnamed expression (DuckDB names it by its rendering) never repeats a name here.
    placeheld = [n or f"\0{i}" for i, n in enumerate(names)]
    unique = duckdb_unique(placeheld)
    changed = [i for i, (a, b) in enumerate(zip(placeheld, unique, strict=True)) if a != b]
    if not changed:
        return
    if not all(names[: changed[-1] + 1]):
        raise unsupported("repeated column names in a derived table with unnamed columns")
    body = item.this.unnest() if isinstance(item.this, exp.Subquery) else item.this
    distinct = body.args.get("distinct")
    if body.args.get("order") or (isinstance(distinct, exp.Distinct) and distinct.args.get("on")):
        # Inside, DuckDB sorts by the last column of a repeated name; the new names say the first.
        raise unsupported("ORDER BY or DISTINCT ON in a derived table with repeated column names")
    if not isinstance(alias, exp.TableAlias):
        alias = exp.TableAlias(this=exp.to_identifier(item.alias_or_name or "unnamed_subquery"))
        item.set("alias", alias)
    alias.set("columns", [exp.to_identifier(n, quoted=True) for n in unique[: changed[-1] + 1]])
