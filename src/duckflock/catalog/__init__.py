"""Tables, their files and how they are partitioned, persisted in the data directory."""

from duckflock.catalog.catalog import Catalog, PartitionInfo, TableInfo
from duckflock.catalog.partitioning import (
    Arbitrary,
    Hashed,
    Partitioning,
    Ranged,
    Replicated,
    Single,
)

__all__ = [
    "Arbitrary",
    "Catalog",
    "Hashed",
    "PartitionInfo",
    "Partitioning",
    "Ranged",
    "Replicated",
    "Single",
    "TableInfo",
]
