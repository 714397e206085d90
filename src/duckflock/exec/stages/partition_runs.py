"""A stage run once per group of this rank's partitions instead of once over all of them.

A rank holds several partitions of a partitioned input (partition p lives on rank p % ranks). When
the rows a stage received into such a partitioning are larger than DuckDB's memory limit, its hash
tables spill and its joins and aggregates run externally, several times slower, and the spilling
takes most of the query's time. Run instead once per group of partitions, each run reading only
that group's table files and received rows, the hash tables of a run fit.

Why the runs' rows together are the stage's rows: a plan is correct for any number of ranks, and so
for any spread of partitions over ranks that keeps partition p of every input in one place; a group
is such a place. That holds only when every partitioned input is split by one partitioning: the
same hash (count and key types) or the same range bounds. Inputs every rank holds whole (broadcasts,
replicated scans, table functions) are read whole by every run, as by every rank. Rows spread by
hot key (plan/skew.py) or still to be measured (an adaptive broadcast) are not split by partition:
such a stage runs once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from duckflock.catalog import Catalog
from duckflock.catalog.partitioning import (
    Hashed,
    Partitioning,
    Ranged,
    canonical_hash_type,
    partitions_of_rank,
)
from duckflock.catalog.placement import partition_sql
from duckflock.exchange.kinds import ExchangeKind
from duckflock.local_duckdb import drop_views
from duckflock.plan.nodes import (
    Aggregate,
    Distinct,
    ExchangeRead,
    Join,
    Node,
    Scan,
    SetOp,
    Sort,
    Window,
    walk,
)
from duckflock.plan.render import exchange_table
from duckflock.plan.stages import Stage, StagePlan
from duckflock.units import human

# Operators whose memory grows with their input: hash tables, sorts, windows.
_HOLDING = (Join, Aggregate, Window, Distinct, SetOp, Sort)


@dataclass(frozen=True)
class PartitionGroups:
    """The groups of this rank's partitions a stage runs once each, and how each run reads them."""

    groups: tuple[tuple[int, ...], ...]
    filters: dict[int, str]  # exchange read -> SQL of each received row's partition number
    input_bytes: int  # received rows the runs share
    limit: int  # the bytes of inputs a run may read

    @staticmethod
    def whole(xid: int) -> str:
        """The name the exchange's received rows are registered under; each run reads a view."""
        return f"{exchange_table(xid)}_whole"

    def read_group(self, con: duckdb.DuckDBPyConnection, group: tuple[int, ...]) -> None:
        """Point each exchange read of the stage at the group's rows."""
        members = ", ".join(str(p) for p in group)
        for xid, part in self.filters.items():
            con.execute(
                f"CREATE OR REPLACE TEMP VIEW {exchange_table(xid)} AS "
                f"SELECT * FROM {self.whole(xid)} WHERE {part} IN ({members})"
            )

    def close(self, con: duckdb.DuckDBPyConnection) -> None:
        """Drop the views (a view left behind would refuse the next query's exchange table of that
        name). After a failure the error the caller reports is the failure, not a drop's."""
        drop_views(con, [exchange_table(xid) for xid in self.filters])

    def note(self) -> str:
        return (
            f"ran once per group of partitions ({len(self.groups)} runs): "
            f"{human(self.input_bytes, 'B')} received, {human(self.limit, 'B')} per run"
        )


def split(
    root: Node,
    stage: Stage,
    plan: StagePlan,
    catalog: Catalog,
    inputs: dict[int, pa.Table],
    rank: int,
    size: int,
    limit: int,
) -> PartitionGroups | None:
    """How to run ``stage`` (its resolved tree ``root``) in groups of partitions whose inputs fit in
    ``limit`` bytes each; None when it runs once (its inputs fit, or it cannot be split)."""
    if limit <= 0 or stage.on_driver or stage.output is None:
        return None
    out = stage.output
    if out.kind is ExchangeKind.SORT or out.ordered or out.skew is not None or out.fallback_target:
        return None  # its output is sampled, ordered or measured as a whole
    if not any(isinstance(n, _HOLDING) for n in walk(root)):
        return None  # it scans and filters: nothing grows with its input
    found = _partitioned_inputs(root, plan, catalog)
    if found is None:
        return None
    target, filters = found
    owned = partitions_of_rank(target.count, rank, size)
    # Only the received rows count: their size is measured, a scan's is not (its filters, and
    # which side DuckDB builds on, are unknown here). Splitting a stage that reads only tables
    # costs more than it saves when its hash tables fit anyway (each run scans its tables again);
    # a small received side is what DuckDB builds on.
    total = sum(inputs[xid].nbytes for xid in filters)
    runs = min(len(owned), math.ceil(total / limit))
    if runs < 2:
        return None
    return PartitionGroups(_deal(owned, runs), filters, total, limit)


def _partitioned_inputs(
    root: Node, plan: StagePlan, catalog: Catalog
) -> tuple[Hashed | Ranged, dict[int, str]] | None:
    """The one partitioning of the tree's partitioned inputs and each exchange read's partition
    SQL; None when an input is split otherwise or no exchange read is partitioned."""
    found: list[Hashed | Ranged] = []
    filters: dict[int, str] = {}
    for node in walk(root):  # resolved: no AdaptiveJoin; a DriverQuery runs on the driver only
        if isinstance(node, Scan) and not node.replicated:
            part: Partitioning = catalog.table(node.table).partitioning()
            if not isinstance(part, Hashed | Ranged):
                return None
            found.append(part)
        elif isinstance(node, ExchangeRead):
            spec = plan.exchange(node.xid)
            if spec.kind is ExchangeKind.BROADCAST and spec.fallback_target is None:
                continue  # whole on every rank
            if spec.kind not in (ExchangeKind.HASH, ExchangeKind.RANGE) or spec.skew is not None:
                return None
            if spec.fallback_target is not None or not isinstance(spec.target, Hashed | Ranged):
                return None
            found.append(spec.target)
            filters[node.xid] = partition_sql(spec.keys, spec.target)
    if not filters or not all(_alike(found[0], p) for p in found[1:]):
        return None
    return found[0], filters


def _alike(a: Hashed | Ranged, b: Hashed | Ranged) -> bool:
    """Whether every key value lies in the same partition number under ``a`` and ``b``."""
    if isinstance(a, Hashed) and isinstance(b, Hashed):
        return a.count == b.count and a.key_types == b.key_types
    if isinstance(a, Ranged) and isinstance(b, Ranged):
        same_type = canonical_hash_type(a.key_type) == canonical_hash_type(b.key_type)
        return same_type and a.bounds == b.bounds
    return False


def _deal(owned: list[int], runs: int) -> tuple[tuple[int, ...], ...]:
    """``owned`` in ``runs`` consecutive groups of nearly equal length."""
    step = len(owned) / runs
    return tuple(tuple(owned[round(i * step) : round((i + 1) * step)]) for i in range(runs))
