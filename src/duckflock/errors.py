"""Typed errors. Every error a user can cause is one of these, with a message that names the cause."""

from __future__ import annotations

import re

# DuckDB's "Did you mean ...?" hints that name its own catalog tables, never the user's.
_INTERNAL_HINT = re.compile(
    r'\s*Did you mean "(pg_|duckdb_|sqlite_|information_schema)[^"]*"\?', re.IGNORECASE
)

# DuckDB's context of an error in a statement, at the end of its message: the line, and a caret.
_TRACEBACK = "Traceback (most recent call last):"
_CONTEXT = re.compile(r"\n\s*LINE \d+: .*", re.DOTALL)
# A column a failing cast read: a rewrite names them "alias.column" (aliases have no dot), or
# "__o1" and the like for what it computed itself (where DuckDB would name no column).
_SOURCE_COLUMN = re.compile(r"( when casting from source column )[^.\n]+\.", re.MULTILINE)
_COMPUTED_COLUMN = re.compile(r" when casting from source column __\w+$", re.MULTILINE)


def duckdb_message(e: Exception, query: str | None = None) -> str:
    """A DuckDB error's text for the user: without hints that name DuckDB's internal tables.

    ``query``: the user's SQL, of which the failed statement was a rewrite. Its names and text
    are not the user's, so DuckDB's context (the statement's line, a caret) gives way to the
    query, and a cast's source column is named as DuckDB names it in the query itself."""
    text = _INTERNAL_HINT.sub("", str(e)).strip()
    if _TRACEBACK in text:  # a Python reader's error (an object filesystem's), traceback and all
        text = text.rstrip().rsplit("\n", 1)[-1]
    if query:
        text, in_context = _CONTEXT.subn("", text)
        text = _COMPUTED_COLUMN.sub("", _SOURCE_COLUMN.sub(r"\1", text))
        if in_context:
            text = f"{text}\n\nQuery: {query}"
    return text or type(e).__name__


class DuckflockError(Exception):
    """Base of all duckflock errors; the CLI prints these without a traceback."""


class SqlError(DuckflockError):
    """The SQL text could not be parsed, or uses a construct duckflock does not run."""


class NotDistributed(SqlError):
    """A valid query using a construct the planner does not distribute yet: a refusal, which the
    driver may answer instead (sql/driver_fallback.py). ``construct`` names it the same way every
    time (no names or values of the query in it): what the fallback reports, and what counts of
    refusals group by."""

    def __init__(self, message: str, construct: str):
        self.construct = construct
        super().__init__(message)

    def __reduce__(self):  # picklable, so it can cross process boundaries intact
        return (NotDistributed, (str(self), self.construct))


class InternalError(DuckflockError):
    """A bug in duckflock (an exception the code did not expect), with the query it met: never
    taken for a refusal, never answered another way."""

    def __init__(self, where: str, cause: str, query: str = ""):
        self.where = where
        self.cause = cause
        self.query = query
        text = f"internal error in the {where} (a bug in duckflock): {cause}"
        super().__init__(f"{text}\n\nQuery: {query}" if query else text)

    def __reduce__(self):
        return (InternalError, (self.where, self.cause, self.query))


class CatalogError(DuckflockError):
    """A table, column or data directory is missing or inconsistent."""


class TransportError(DuckflockError):
    """Moving bytes between ranks failed (peer lost, timeout, bad token)."""


class QueryCancelled(DuckflockError):
    """The query was stopped before it ended: by its caller (``Session.interrupt``, Ctrl-C, SIGTERM),
    or because the caller went away. Its ranks are ready for the next query."""


class ExecutionError(DuckflockError):
    """A stage failed on some rank. Carries the rank and stage so the message names them."""

    def __init__(self, rank: int, stage: int | None, cause: str):
        self.rank = rank
        self.stage = stage
        self.cause = cause
        where = f"rank {rank}" + (f", stage {stage}" if stage is not None else "")
        super().__init__(f"{where}: {cause}")

    def __reduce__(self):  # picklable, so it can cross process boundaries intact
        return (ExecutionError, (self.rank, self.stage, self.cause))
