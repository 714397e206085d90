"""Python values and names as DuckDB SQL: the quoting functions every layer uses to write paths,
settings, constants and identifiers into SQL text."""

from __future__ import annotations

import datetime as dt
import math


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sql_literal(value: object) -> str:
    """A DuckDB literal for a Python value: strings, numbers, bools, dates, timestamps, decimals,
    lists and dicts (structs)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return f"'{value}'::DOUBLE"  # inf, -inf, nan: names, not numbers, in SQL
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        # An instant: a TIMESTAMP literal would drop the offset, and compared with a TIMESTAMPTZ
        # it would be read in the session's zone (another instant, or in a DST fold either).
        return f"TIMESTAMPTZ '{value.astimezone(dt.UTC).isoformat(sep=' ')}'"
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{sql_literal(str(k))}: {sql_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(sql_literal(v) for v in value) + "]"
    return "'" + str(value).replace("'", "''") + "'"
