"""How an exchange moves rows between ranks: the exchange layer routes by it, the planner chooses
it (plan/distribute.py). A string enum, as plan/kinds.py's: its value is what EXPLAIN prints."""

from __future__ import annotations

from enum import StrEnum


class ExchangeKind(StrEnum):
    HASH = "hash"
    RANGE = "range"  # by the bounds of a range-partitioned table
    SORT = "sort"  # range by splitters sampled at run time (a parallel sort)
    BROADCAST = "broadcast"
    GATHER = "gather"

    @property
    def routes_rows(self) -> bool:
        """Each row goes to one rank chosen by its values (a ``__target`` column)."""
        return self in (ExchangeKind.HASH, ExchangeKind.RANGE, ExchangeKind.SORT)
