"""Python values as DuckDB SQL literals: the one quoting function every layer uses to write paths,
settings and constants into SQL text."""

from __future__ import annotations

import datetime as dt


def sql_literal(value: object) -> str:
    """A DuckDB literal for a Python value: strings, numbers, bools, dates, timestamps, decimals,
    lists and dicts (structs)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{sql_literal(str(k))}: {sql_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(sql_literal(v) for v in value) + "]"
    return "'" + str(value).replace("'", "''") + "'"
