"""Which stage may read an exchange as a stream, while the stage producing it still runs.

A stage otherwise starts only once its inputs have all arrived, so a rank holds the whole of each
input (and spills what exceeds its budget) where single-process DuckDB streams the large side of a
join from its files. A consumer may instead run while the producer of one of its inputs still runs,
taking that exchange's batches as they arrive; the stages planned between the two (typically the
other side of the join) run meanwhile too, before the consumer, on the same thread as it. This holds
when DuckDB can process the exchange as a stream and the stages can overlap:

- the path from the consumer's root to the exchange passes only through single-input operators and
  the probe (left) sides of hash joins (inner, left, semi, anti) whose build sides hold no joins or
  subqueries and, by the planner's estimates, are not larger than the stream, nor than DuckDB's
  memory on the rank: a build side that must spill is better split into partition runs
  (exec/stages/partition_runs.py), which a stage reading a stream cannot be;
- only the producer may call a collective (a sampled sort, hot-key detection): collectives pair
  their calls by order, which stages running at once would interleave; the producer's output is
  not a measured broadcast (its outcome changes which stages run);
- every stage involved runs on every rank, the stages in between do not read the exchange, and the
  consumer is not the final stage.

DuckDB cannot know a stream's size (it estimates one row) and would build its hash table on it; a
consumer that streams through joins is therefore planned with DuckDB's join reordering off, so its
joins run as written: the stream probes, the other sides are built (``fixed_join_order``). Inner and
right joins with the stream on their right are written the other way round first (``probe_first``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from duckflock.catalog import Catalog
from duckflock.exchange.kinds import ExchangeKind
from duckflock.plan.kinds import JoinKind, SkewRole
from duckflock.plan.nodes import (
    AdaptiveJoin,
    ExchangeRead,
    Join,
    Node,
    Scan,
    SetOp,
    Unary,
    WithSubqueries,
    transform_up,
    walk,
)
from duckflock.plan.stages import ExchangeSpec, Stage, StagePlan

_PROBE_LEFT = (JoinKind.INNER, JoinKind.LEFT, JoinKind.SEMI, JoinKind.ANTI)


def streamed_input(
    plan: StagePlan,
    i: int,
    catalog: Catalog,
    size: int,
    memory_bytes: float = float("inf"),
    min_bytes: float = 0,
) -> int | None:
    """The exchange stage ``plan.stages[i]`` may read as a stream, if any (see the module);
    ``memory_bytes`` is DuckDB's memory limit on a rank; an exchange estimated to bring a rank
    fewer than ``min_bytes`` is not streamed: it would bound no memory, and stages running at once
    only contend for the rank's cores and the interpreter."""
    consumer = plan.stages[i]
    if consumer.on_driver or consumer.output is None or consumer.when or calls_collective(consumer.output):
        return None
    if any(isinstance(n, AdaptiveJoin) for n in walk(consumer.root)):
        return None
    for xid in consumer.inputs:
        if _per_rank(plan.exchange(xid), size)[1] < min_bytes:
            continue
        j = next(k for k, s in enumerate(plan.stages) if s.sid == plan.exchange(xid).producer)
        if _overlappable(plan, j, i, xid) and _probe_stream(plan, consumer, xid, catalog, size, memory_bytes):
            return xid
    return None


def _overlappable(plan: StagePlan, j: int, i: int, xid: int) -> bool:
    """Whether stages ``j`` (producing ``xid``) to ``i`` (reading it) may run as the module says."""
    producer, between = plan.stages[j], plan.stages[j + 1 : i]
    spec = producer.output
    assert spec is not None
    if producer.on_driver or producer.when or spec.ordered or spec.fallback_target is not None:
        return False
    for s in between:
        if s.on_driver or s.when or s.output is None or calls_collective(s.output) or xid in s.inputs:
            return False
    return True


def _probe_stream(
    plan: StagePlan, consumer: Stage, xid: int, catalog: Catalog, size: int, memory_bytes: float
) -> bool:
    if sum(1 for n in walk(consumer.root) if isinstance(n, ExchangeRead) and n.xid == xid) != 1:
        return False  # DuckDB reads a stream once
    stream_rows = _per_rank(plan.exchange(xid), size)[0]
    root = probe_first(consumer.root, xid)

    def small_enough(side: Node) -> bool:
        rows, nbytes = _size(side, plan, catalog, size)
        return rows <= stream_rows and nbytes <= memory_bytes

    return _streams_to(root, xid, small_enough)


def probe_first(root: Node, xid: int) -> Node:
    """``root`` with every inner or right join that reads exchange ``xid`` on its right side written
    the other way round (a right join becomes a left one): the same rows, named columns in the same
    order, and the stream on the side DuckDB probes with when joins run as written."""

    def swap(node: Node) -> Node:
        if not isinstance(node, Join) or node.lateral or node.kind not in (JoinKind.INNER, JoinKind.RIGHT):
            return node
        if not _reads(node.right, xid) or _reads(node.left, xid):
            return node
        return replace(
            node,
            left=node.right,
            right=node.left,
            kind=JoinKind.INNER if node.kind is JoinKind.INNER else JoinKind.LEFT,
            left_keys=node.right_keys,
            right_keys=node.left_keys,
            left_key_cols=node.right_key_cols,
            right_key_cols=node.left_key_cols,
        )

    return transform_up(root, swap)


def _reads(node: Node, xid: int) -> bool:
    return any(isinstance(n, ExchangeRead) and n.xid == xid for n in walk(node))


def build_rows(root: Node, xid: int, catalog: Catalog, size: int, received: Callable[[int], int]) -> float:
    """The most rows any build side on the stream's path holds on this rank: tables by the catalog
    (an upper bound: filters not counted), exchanges as ``received``. A stream that has brought
    more rows than this is the larger side of every join it passes, whatever the planner
    estimated for it."""
    sides = [0.0]

    def collect(node: Node) -> None:
        if isinstance(node, Join) and _reads(node.left, xid):
            side = 0.0
            for n in walk(node.right):
                if isinstance(n, ExchangeRead):
                    side += received(n.xid)
                elif isinstance(n, Scan):
                    side += _scan_rows(n, catalog, size)
            sides.append(side)
        for c in node.children:
            collect(c)

    collect(probe_first(root, xid))
    return max(sides)


def fixed_join_order(stage: Stage) -> bool:
    """Whether the stage's joins must run as written (it streams an input through a join)."""
    return any(isinstance(n, Join) for n in walk(stage.root))


def calls_collective(spec: ExchangeSpec) -> bool:
    """Whether producing this exchange calls a collective."""
    sort, measured = spec.kind is ExchangeKind.SORT, spec.fallback_target is not None
    return sort or measured or spec.skew is SkewRole.SPREAD


def _streams_to(node: Node, xid: int, small_enough: Callable[[Node], bool]) -> bool:
    """Whether ``node``'s rows can be computed while exchange ``xid`` streams in (see the module)."""
    if isinstance(node, ExchangeRead):
        return node.xid == xid
    if isinstance(node, WithSubqueries) and node.subqueries:
        return False
    if isinstance(node, Unary):
        return _streams_to(node.child, xid, small_enough)
    if isinstance(node, Join):
        probe_left = node.kind in _PROBE_LEFT and node.left_keys and not node.lateral
        return bool(
            probe_left
            and _plain(node.right)
            and small_enough(node.right)
            and _streams_to(node.left, xid, small_enough)
        )
    return False


def _plain(node: Node) -> bool:
    """No join, set operation or subquery: DuckDB builds it the same way in any join order."""
    for n in walk(node):
        if isinstance(n, (Join, SetOp, AdaptiveJoin)) or (isinstance(n, WithSubqueries) and n.subqueries):
            return False
    return True


def _per_rank(spec: ExchangeSpec, size: int) -> tuple[float, float]:
    """The (rows, bytes) of the exchange one rank receives, by the planner's estimate."""
    share = 1 if spec.kind is ExchangeKind.BROADCAST else size
    return spec.est[0] / share, spec.est[1] / share


def _size(node: Node, plan: StagePlan, catalog: Catalog, size: int) -> tuple[float, float]:
    """(rows, bytes) a build side holds on one rank, by the catalog and the planner's estimates."""
    rows = nbytes = 0.0
    for n in walk(node):
        if isinstance(n, ExchangeRead):
            r, b = _per_rank(plan.exchange(n.xid), size)
        elif isinstance(n, Scan):
            r = _scan_rows(n, catalog, size)
            b = r * catalog.table(n.table).row_width(list(n.source_columns))
        else:
            continue
        rows, nbytes = rows + r, nbytes + b
    return rows, nbytes


def _scan_rows(scan: Scan, catalog: Catalog, size: int) -> float:
    """The most rows the scan gives any rank (all of them when replicated)."""
    info = catalog.table(scan.table)
    if scan.replicated:
        return info.rows
    return max(sum(info.partitions[p].rows for p in info.partitions_of_rank(r, size)) for r in range(size))
