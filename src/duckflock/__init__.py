"""duckflock: one SQL query answered by many DuckDB processes together."""

from duckflock.config import Config
from duckflock.errors import (
    CatalogError,
    DuckflockError,
    ExecutionError,
    PlanError,
    SqlError,
    TransportError,
)
from duckflock.session import Result, Session, connect
from duckflock.spmd import spmd

__all__ = [
    "CatalogError",
    "Config",
    "DuckflockError",
    "ExecutionError",
    "PlanError",
    "Result",
    "Session",
    "SqlError",
    "TransportError",
    "connect",
    "spmd",
]
