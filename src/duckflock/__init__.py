"""duckflock: one SQL query answered by many DuckDB processes together."""

from typing import TYPE_CHECKING

from duckflock.config import Config
from duckflock.errors import (
    CatalogError,
    DuckflockError,
    ExecutionError,
    InternalError,
    NotDistributed,
    QueryCancelled,
    SqlError,
    TransportError,
)

# The engine (DuckDB, Arrow, MPI) is imported on first use: ``duckflock`` as a launcher (the process
# that starts mpiexec and waits) then stays small, since a node's memory is what the ranks need.
_LAZY = {
    "connect": "session",
    "Session": "session",
    "Result": "session",
    "spmd": "spmd",
    "Progress": "exec.reports",
    "vacuum": "ingest.vacuum",
}

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
    from duckflock.exec.reports import Progress
    from duckflock.ingest.vacuum import vacuum
    from duckflock.session import Result, Session, connect
    from duckflock.spmd import spmd


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"duckflock.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'duckflock' has no attribute {name!r}")


__all__ = [
    "CatalogError",
    "Config",
    "DuckflockError",
    "ExecutionError",
    "InternalError",
    "NotDistributed",
    "Progress",
    "QueryCancelled",
    "Result",
    "Session",
    "SqlError",
    "TransportError",
    "connect",
    "spmd",
    "vacuum",
]
