"""Broadcasts measured before they are replicated.

The producer of a measured broadcast computes each row's hash target along with the row, holds its
first rows until they exceed the exchange's bound (``fallback_above``: the broadcast threshold, or
``broadcast_max_bytes`` for a side broadcast for being cheap to copy) or end, and the ranks add up
what they hold: within the bound the rows are broadcast, above it they are hashed on the join keys
instead.
Every rank learns the same answer, so all of them then run the same plan of each AdaptiveJoin.
"""

from __future__ import annotations

import pyarrow as pa

from duckflock.exec.resources.runtime import Runtime
from duckflock.plan.nodes import AdaptiveJoin, ExchangeRead, Node, transform_up, walk
from duckflock.plan.stages import Stage


def measure(reader: pa.RecordBatchReader, threshold: int) -> tuple[list[pa.RecordBatch], int]:
    """This rank's first batches, read until they hold more than ``threshold`` bytes (not counting
    the target column, the last) or the reader ends; and their size."""
    held: list[pa.RecordBatch] = []
    size = 0
    while size <= threshold:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        held.append(batch)
        size += batch.nbytes - batch.column(batch.num_columns - 1).nbytes
    return held, size


def agree(rt: Runtime, qid: int, local_bytes: int) -> int:
    """The ranks' bytes added up; a collective that every rank calls for every measured broadcast
    (ranks that do not produce it, when it comes from the driver, with 0)."""
    return sum(rt.mux.allgather(qid, local_bytes))


def runs(stage: Stage, shuffled: set[int]) -> bool:
    """Whether the plans chosen so far need ``stage``."""
    return all(x in shuffled for x in stage.when)


def resolve(root: Node, shuffled: set[int]) -> Node:
    """The stage's tree with each AdaptiveJoin replaced by the plan its measured side chose."""

    def choose(node: Node) -> Node:
        if isinstance(node, AdaptiveJoin):
            return node.shuffle if node.xid in shuffled else node.broadcast
        return node

    return transform_up(root, choose)


def reads(root: Node) -> list[int]:
    """The exchanges a resolved tree reads, each once."""
    return list(dict.fromkeys(n.xid for n in walk(root) if isinstance(n, ExchangeRead)))
