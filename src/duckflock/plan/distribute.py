"""Add exchanges to a logical plan: each node states where it needs its input rows, and an Exchange is
inserted wherever the child does not already provide that (DataFusion's required distribution).

Join strategy comes from the catalog: co-located when both sides are already partitioned alike (hash
with the same function and count, or aligned ranges), broadcast when one side is small, otherwise a
shuffle of only the side not yet partitioned on the key — or of both.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple, TypeVar

from duckflock.catalog import Catalog
from duckflock.catalog.partitioning import (
    Arbitrary,
    Hashed,
    Partitioning,
    Ranged,
    Replicated,
    Single,
    canonical_hash_type,
    co_located,
)
from duckflock.config import Config
from duckflock.exchange.kinds import ExchangeKind
from duckflock.plan import skew
from duckflock.plan.aggregates import split_aggregates
from duckflock.plan.kinds import AggPhase, JoinKind, JoinStrategy, SetOpKind
from duckflock.plan.nodes import (
    AdaptiveJoin,
    Aggregate,
    Distinct,
    DriverQuery,
    Exchange,
    Filter,
    FunctionScan,
    Join,
    Limit,
    Node,
    Project,
    Scan,
    SetOp,
    Sort,
    Values,
    Window,
    WithSubqueries,
    referenced,
    walk,
)
from duckflock.sqltext import quote_ident as q

# How far over the broadcast threshold a filtered side's estimate may be and still be broadcast
# (measured, or read whole from shared storage when what it scans is at most twice that): estimates
# take every filter to keep half the rows, while a selective one (LIKE '%green%' on TPC-H's parts)
# keeps a few percent: an order of magnitude below the estimate. Broadcast then, the large side
# stays where it is instead of being shuffled whole; a side that turns out larger is hashed instead.
FILTERED_SLACK = 4

# A side over the broadcast threshold is broadcast only where its copies on all ranks weigh at most
# 1/COPY_MARGIN of the other side: every rank builds the whole hash table (work and memory repeated
# on each) and estimates err. A copy near the other side's size is slower than shuffling that side
# and multiplies the ranks' memory; a copy well below it saves the shuffle's time and memory.
COPY_MARGIN = 2

# DuckDB's LIMIT is a BIGINT: a rank's top-k of LIMIT + OFFSET rows is capped here.
_MAX_LIMIT = (1 << 63) - 1


@dataclass(frozen=True)
class Placed:
    """A physical subtree with the partitionings its output satisfies and its estimated size."""

    node: Node
    parts: tuple[Partitioning, ...]
    rows: float
    width: int

    @property
    def bytes(self) -> float:
        return self.rows * self.width

    @property
    def on_driver(self) -> bool:
        """All rows on rank 0: a single-partition table, or gathered."""
        return any(isinstance(p, Single) for p in self.parts)

    @property
    def single(self) -> bool:
        """The driver can compute this itself: its rows are on rank 0 or on every rank."""
        return self.on_driver or self.replicated

    @property
    def replicated(self) -> bool:
        return any(isinstance(p, Replicated) for p in self.parts)


class Target(NamedTuple):
    """Where to shuffle one join side so that it meets the other side's rows where they are."""

    keys: tuple[str, ...]  # the moved side's key SQL
    partitioning: Partitioning  # the staying side's, in the moved side's columns
    pairs: tuple[int, ...]  # the join's equi pairs the keys come from


def distribute(
    plan: Node, catalog: Catalog, size: int, config: Config, per_process: int = 1
) -> tuple[Node, bool]:
    """``plan`` placed on ``size`` ranks, ``per_process`` of them in each process; and whether it
    reads a table whole that fits the ranks' memory only once per process (exec/resources/fused.py)."""
    planner = _Planner(catalog, size, config, per_process)
    top = planner.place(plan)
    return planner.to_single(top).node, planner.copies_per_process


class _Planner:
    def __init__(self, catalog: Catalog, size: int, config: Config, per_process: int = 1):
        self.catalog = catalog
        self.size = size
        self.config = config
        self.per_process = per_process
        self.copies_per_process = False  # a table read whole is allowed the memory of a process
        self._ids = itertools.count(1)

    def fresh(self, stem: str) -> str:
        return f"__{stem}x{next(self._ids)}"

    # ---- exchanges ---------------------------------------------------------------------------------
    def to_single(self, p: Placed) -> Placed:
        if p.single or self.size == 1:
            return replace(p, parts=(Single(),))
        return Placed(
            Exchange(
                p.node.columns, child=p.node, kind=ExchangeKind.GATHER, target=Single(), est=(p.rows, p.bytes)
            ),
            (Single(),),
            p.rows,
            p.width,
        )

    def broadcast(self, p: Placed) -> Placed:
        if p.replicated:
            return p
        if self.config.shared_storage and _scans_only(p.node):
            # Every rank reads the whole (small) input from the shared data directory: no network.
            return Placed(_replicate_scans(p.node), (Replicated(),), p.rows, p.width)
        node = Exchange(
            p.node.columns,
            child=p.node,
            kind=ExchangeKind.BROADCAST,
            target=Replicated(),
            est=(p.rows, p.bytes),
            from_driver=p.on_driver,
        )
        return Placed(node, (Replicated(),), p.rows, p.width)

    def hash_to(self, p: Placed, keys: tuple[str, ...], target: Partitioning) -> Placed:
        kind = ExchangeKind.RANGE if isinstance(target, Ranged) else ExchangeKind.HASH
        node = Exchange(
            p.node.columns,
            child=p.node,
            kind=kind,
            target=target,
            keys=keys,
            est=(p.rows, p.bytes),
            local=p.replicated,  # sending every rank's copy would multiply the rows
            from_driver=p.on_driver and not p.replicated,
        )
        return Placed(node, (target,), p.rows, p.width)

    # ---- nodes ---------------------------------------------------------------------------------------
    def place(self, node: Node) -> Placed:
        if isinstance(node, Scan):
            return self.scan(node)
        if isinstance(node, Values | FunctionScan):
            return _generated(node)
        if isinstance(node, Filter | Project):
            return self.filter_or_project(node)
        if isinstance(node, Join):
            return self.join(node)
        if isinstance(node, Aggregate):
            return self.aggregate(node)
        if isinstance(node, Distinct):
            return self.distinct(node)
        if isinstance(node, Sort | Limit):
            return self.sort_or_limit(node)
        if isinstance(node, Window):
            return self.window(node)
        if isinstance(node, SetOp):
            return self.set_op(node)
        if isinstance(node, DriverQuery):
            return self.driver_query(node)
        raise TypeError(f"no distribution rule for {type(node).__name__}")

    def filter_or_project(self, node: Filter | Project) -> Placed:
        """Rows stay where they are; the subqueries' results go to them."""
        c = self.place(node.child)
        if isinstance(node, Filter):
            return Placed(self.with_subqueries(node, c), c.parts, max(1.0, c.rows * 0.5), c.width)
        parts = _project_parts(node, c.parts)
        return Placed(self.with_subqueries(node, c), parts, c.rows, 16 * len(node.exprs))

    def with_subqueries(self, node: Filter | Project, child: Placed) -> Node:
        """Subquery results must be wherever the expression is evaluated: on the driver when the
        child is there, otherwise on every rank (broadcast). A correlated subquery is evaluated
        inline by DuckDB for each outer row, so its inputs must be whole there: see ``inline``."""
        subs = []
        for token, sub in node.subqueries:
            if token in node.correlated:
                subs.append(self.inline(sub, set(child.node.columns)))
                continue
            placed = self.place(sub)
            placed = self.to_single(placed) if child.on_driver else self.broadcast(placed)
            subs.append(placed.node)
        return node.with_children((child.node, *subs))

    def inline(self, node: Node, outer: set[str]) -> Node:
        """A correlated subquery's plan with no exchange inside its correlated part: every subtree
        that does not read an outer column is planned on its own and replicated (so it is whole on
        every rank); the parts that do read one stay as they are, for DuckDB to decorrelate."""
        if not (referenced(node) & outer):
            return self.broadcast(self.place(node)).node
        if isinstance(node, WithSubqueries):
            inner = outer | set(node.child.columns)
            subs = tuple(self.inline(s, inner) for _, s in node.subqueries)
            return node.with_children((self.inline(node.child, outer), *subs))
        return node.with_children(tuple(self.inline(c, outer) for c in node.children))

    def driver_query(self, node: DriverQuery) -> Placed:
        """Every input whole on the driver: read there from shared storage, or gathered."""
        inputs = []
        for child in node.children:
            p = self.place(child)
            if self.config.shared_storage and _scans_only(p.node):
                p = Placed(_replicate_scans(p.node), (Replicated(),), p.rows, p.width)
            inputs.append(self.to_single(p).node)
        return Placed(node.with_children(tuple(inputs)), (Single(),), 1000, 8 * len(node.columns))

    def scan(self, node: Scan) -> Placed:
        info = self.catalog.table(node.table)
        width = info.row_width(list(node.source_columns))
        rows = float(max(info.rows, 1))
        if self.size == 1 or len(info.partitions) == 1:
            return Placed(node, (Single(),), rows, width)  # partition 0 lives on rank 0, the driver
        rename = dict(zip(node.source_columns, node.columns, strict=True))
        part = info.partitioning()
        if isinstance(part, Hashed) and all(k is not None and k in rename for k in part.keys):
            part = Hashed(tuple(rename[k] for k in part.keys if k is not None), part.key_types, part.count)
        elif isinstance(part, Ranged) and part.key in rename:
            part = replace(part, key=rename[part.key])
        else:
            part = Arbitrary()
        return Placed(node, (part,), rows, width)

    def join(self, node: Join) -> Placed:
        if node.lateral:
            return self.lateral(node)
        left, right = self.place(node.left), self.place(node.right)
        in_place = self._join_in_place(node, left, right)
        if in_place is not None:
            return in_place
        if left.on_driver or right.on_driver:
            return self._join_with_driver_side(node, left, right)
        return self._join_moving(node, left, right, self._cheapest_strategy(node, left, right))

    def _join_in_place(self, node: Join, left: Placed, right: Placed) -> Placed | None:
        """The strategies that move no rows, in order of preference; None when every one is wrong."""
        kind = node.kind
        if self.size == 1:
            return _joined(node, left, right, (Single(),), JoinStrategy.LOCAL)
        if left.replicated and right.replicated:
            return _joined(node, left, right, (Replicated(),), JoinStrategy.LOCAL)
        if (left.on_driver and (right.on_driver or (right.replicated and kind.allows_replicated_right))) or (
            right.on_driver and left.replicated and kind.allows_replicated_left
        ):
            return _joined(node, left, right, (Single(),), JoinStrategy.LOCAL_ON_DRIVER)
        if _co_located(node, left, right):
            parts = _join_parts(kind, left.parts, right.parts)
            return _joined(node, left, right, parts, JoinStrategy.CO_LOCATED)
        if right.replicated and kind.allows_replicated_right:
            return _joined(node, left, right, left.parts, JoinStrategy.RIGHT_REPLICATED)
        if left.replicated and kind.allows_replicated_left:
            return _joined(node, left, right, right.parts, JoinStrategy.LEFT_REPLICATED)
        return None

    def _join_with_driver_side(self, node: Join, left: Placed, right: Placed) -> Placed:
        """One side sits on the driver: send it to every rank, or bring the other side to it."""
        if right.on_driver and node.kind.allows_replicated_right:
            return self.checked_broadcast(node, left, right, "right")
        if left.on_driver and node.kind.allows_replicated_left:
            return self.checked_broadcast(node, left, right, "left")
        return _joined(
            node, self.to_single(left), self.to_single(right), (Single(),), JoinStrategy.GATHER_BOTH
        )

    def _cheapest_strategy(self, node: Join, left: Placed, right: Placed) -> JoinStrategy:
        """The candidate with the least network cost in bytes; broadcasts only below the threshold
        (a filtered side's estimate knows nothing of its filters' selectivity: it may be up to
        ``FILTERED_SLACK`` times over, since its broadcast is measured and shuffled if too large),
        or below ``broadcast_max_bytes`` where copies are cheap next to the other side (_copy_bound)."""
        kind, n = node.kind, self.size
        options: list[tuple[float, JoinStrategy]] = []
        if kind.allows_replicated_right and right.bytes <= self._broadcastable(node, right, left):
            options.append((right.bytes * (n - 1), JoinStrategy.BROADCAST_RIGHT))
        if kind.allows_replicated_left and left.bytes <= self._broadcastable(node, left, right):
            options.append((left.bytes * (n - 1), JoinStrategy.BROADCAST_LEFT))
        if node.left_keys:
            frac = (n - 1) / n
            if self._target_for(node, left.parts, "left") is not None:
                options.append((right.bytes * frac, JoinStrategy.SHUFFLE_RIGHT))
            if self._target_for(node, right.parts, "right") is not None:
                options.append((left.bytes * frac, JoinStrategy.SHUFFLE_LEFT))
            options.append(((left.bytes + right.bytes) * frac, JoinStrategy.SHUFFLE_BOTH))
        if options:
            return min(options, key=lambda o: o[0])[1]
        # No equi keys and no small side. A full outer join keeps unmatched rows of both sides:
        # only one rank may see both inputs whole. Otherwise broadcast the smaller permitted side.
        if not (kind.allows_replicated_right or kind.allows_replicated_left):
            return JoinStrategy.GATHER_BOTH
        if kind.allows_replicated_right and (right.bytes <= left.bytes or not kind.allows_replicated_left):
            return JoinStrategy.BROADCAST_RIGHT
        return JoinStrategy.BROADCAST_LEFT

    def _broadcastable(self, node: Join, side: Placed, other: Placed) -> float:
        """Up to how many estimated bytes ``side`` may be broadcast."""
        small = self.config.broadcast_threshold_bytes
        measured = bool(node.left_keys) and not other.replicated  # see checked_broadcast
        # Tables read whole by every rank from shared storage are not measured: bound what they
        # read before their filters.
        bounded = self._scanned_bytes(side.node) <= 2 * small * FILTERED_SLACK
        bound = small * FILTERED_SLACK if measured and bounded and _filtered(side.node) else small
        return bound if side.bytes <= bound else max(bound, self._copy_bound(node, side, other))

    def _copy_bound(self, node: Join, side: Placed, other: Placed) -> int:
        """For a side over the threshold: ``broadcast_max_bytes`` where its copies on all ranks add
        up to at most 1/COPY_MARGIN of the other side (so broadcasting it moves fewer bytes than
        moving the other side would, by a margin), else 0. Only where the copy is measured before it
        is replicated (checked_broadcast), or, read whole by every rank from shared storage, reads
        at most that."""
        cap, small = self.config.broadcast_max_bytes, self.config.broadcast_threshold_bytes
        copies = side.bytes * self.size * COPY_MARGIN
        if small <= 0 or cap <= small or side.bytes <= small or copies > other.bytes:
            return 0
        if self.config.shared_storage and _scans_only(side.node):
            scanned = self._scanned_bytes(side.node)
            if scanned <= cap:
                return cap
            # Joined with tables only, its stage may run once for all the ranks of a process,
            # with their memory: one copy per process (plan_query checks that it does).
            if scanned <= cap * self.per_process and _scans_only(other.node):
                self.copies_per_process = True
                return cap * self.per_process
            return 0
        return cap if node.left_keys and not other.replicated else 0

    def _scanned_bytes(self, node: Node) -> float:
        """The bytes of the table columns a subtree scans, before any filter."""
        return sum(
            self.catalog.table(n.table).scanned_bytes(n.source_columns)
            for n in walk(node)
            if isinstance(n, Scan)
        )

    def _join_moving(self, node: Join, left: Placed, right: Placed, strategy: JoinStrategy) -> Placed:
        """Move the inputs as ``strategy`` says, then join them where they meet."""
        if strategy is JoinStrategy.GATHER_BOTH:
            return _joined(node, self.to_single(left), self.to_single(right), (Single(),), strategy)
        if strategy is JoinStrategy.BROADCAST_RIGHT:
            return self.checked_broadcast(node, left, right, "right")
        if strategy is JoinStrategy.BROADCAST_LEFT:
            return self.checked_broadcast(node, left, right, "left")
        pairs: tuple[int, ...] = ()  # of a side shuffled into the other's placement
        if strategy is JoinStrategy.SHUFFLE_RIGHT:
            keys, target, pairs = self._required_target(node, left.parts, "left")
            right = self.hash_to(right, keys, target)
        elif strategy is JoinStrategy.SHUFFLE_LEFT:
            keys, target, pairs = self._required_target(node, right.parts, "right")
            left = self.hash_to(left, keys, target)
        else:
            left = self.hash_to(left, node.left_keys, self._fresh_hash(node, "left"))
            right = self.hash_to(right, node.right_keys, self._fresh_hash(node, "right"))
        if self.config.skew_joins:
            marked = skew.spread_hot_keys(
                node, left, right, strategy, pairs, self.config.skew_min_rows, self.fresh
            )
            if marked is not None:
                # Rows of a hot key end up on every rank: the output is partitioned by nothing.
                lp, rp = replace(left, node=marked[0]), replace(right, node=marked[1])
                return _joined(node, lp, rp, (Arbitrary(),), strategy)
        return _joined(node, left, right, _join_parts(node.kind, left.parts, right.parts), strategy)

    def checked_broadcast(self, node: Join, left: Placed, right: Placed, small: Side) -> Placed:
        """Broadcast the ``small`` side, measured at run time: if it turns out larger than the
        threshold (or, for a side copied for being cheap, ``_copy_bound``) it is hashed on the join
        keys instead — into the other side's partitioning when
        that side is partitioned on a join key (nothing else changes), otherwise into a fresh one,
        with the other side hashed too (an AdaptiveJoin of both plans). Kept unmeasured where no
        shuffle gives the same rows: no equi keys, or a replicated other side."""
        big_side: Side = "left" if small == "right" else "right"
        big, small_p = (left, right) if small == "right" else (right, left)
        strategy = JoinStrategy.BROADCAST_RIGHT if small == "right" else JoinStrategy.BROADCAST_LEFT
        bcast = self.broadcast(small_p)
        if not node.left_keys or big.replicated or not isinstance(bcast.node, Exchange):
            return _joined(node, *_by_side(small, big, bcast), big.parts, strategy)
        kept = self._target_for(node, big.parts, big_side)
        fallback = kept[:2] if kept else (_keys(node, small), self._fresh_hash(node, small))
        exchange = replace(
            bcast.node,
            fallback_keys=fallback[0],
            fallback_target=fallback[1],
            fallback_above=self._copy_bound(node, small_p, big) or self.config.broadcast_threshold_bytes,
        )
        bcast = replace(bcast, node=exchange)
        if kept is not None:  # the big side stays where it is either way
            shuffled = (
                JoinStrategy.BROADCAST_RIGHT_ELSE_SHUFFLE
                if small == "right"
                else JoinStrategy.BROADCAST_LEFT_ELSE_SHUFFLE
            )
            return _joined(node, *_by_side(small, big, bcast), big.parts, shuffled)
        first = _joined(node, *_by_side(small, big, bcast), big.parts, strategy)
        moved = self.hash_to(big, _keys(node, big_side), self._fresh_hash(node, big_side))
        lparts, rparts = _by_side(small, moved.parts, (fallback[1],))
        parts = _join_parts(node.kind, lparts, rparts)
        second = _joined(node, *_by_side(small, moved, bcast), parts, JoinStrategy.SHUFFLE_BOTH)
        both = tuple(p for p in first.parts if p in second.parts) or (Arbitrary(),)
        adaptive = AdaptiveJoin(node.columns, broadcast=first.node, shuffle=second.node, measured=exchange)
        return Placed(adaptive, both, first.rows, first.width)

    def lateral(self, node: Join) -> Placed:
        """The left rows stay where they are; the LATERAL side is planned like a correlated
        subquery (every part that does not read the left row is whole on every rank)."""
        left = self.place(node.left)
        right = self.inline(node.right, set(node.left.columns))
        joined = replace(node, left=left.node, right=right, strategy=JoinStrategy.LATERAL)
        width = left.width + 16 * len(node.right.columns)
        return Placed(joined, left.parts, left.rows, width)

    def _fresh_hash(self, node: Join, side: Side) -> Hashed:
        """A partitioning by all of one side's join keys, hashed in their common types."""
        cols = node.left_key_cols if side == "left" else node.right_key_cols
        return Hashed(cols, node.key_types, self.size)

    def _required_target(self, node: Join, parts, side: Side) -> Target:
        found = self._target_for(node, parts, side)
        assert found is not None, "a shuffle of one side is chosen only when its target exists"
        return found

    def _target_for(self, node: Join, parts, side: Side) -> Target | None:
        """If one side is hash/range partitioned on some of its join keys: where to shuffle the
        other side so that it meets the first side's rows."""
        mine = node.left_key_cols if side == "left" else node.right_key_cols
        other_sql = node.right_keys if side == "left" else node.left_keys
        other_cols = node.right_key_cols if side == "left" else node.left_key_cols
        for p in parts:
            if isinstance(p, Hashed):
                idx = [mine.index(k) if k is not None and k in mine else -1 for k in p.keys]
                if -1 in idx or any(p.key_types[i] != node.key_types[j] for i, j in enumerate(idx)):
                    continue
                moved = Hashed(tuple(other_cols[j] for j in idx), p.key_types, p.count)
                return Target(tuple(other_sql[j] for j in idx), moved, tuple(idx))
            if isinstance(p, Ranged) and p.key is not None and p.key in mine:
                j = mine.index(p.key)
                if canonical_hash_type(p.key_type) != node.key_types[j] or node.key_types[j] == "DOUBLE":
                    continue  # route only where both sides compare exactly in one type
                return Target((other_sql[j],), Ranged(other_cols[j], p.key_type, p.bounds, routed=True), (j,))
        return None

    def aggregate(self, node: Aggregate) -> Placed:
        child = self.place(node.child)
        rows = max(1.0, child.rows * 0.3) if node.groups else 1.0
        width = 16 * len(node.columns)
        if node.grouping_sets is not None and not (child.single or self.size == 1):
            return self.grouping_sets(node, child, rows, width)
        if (
            child.single
            or self.size == 1
            or (node.groups and any(_keys_within(p, set(node.groups)) for p in child.parts))
        ):
            return Placed(node.with_children((child.node,)), child.parts, rows, width)
        group_names = node.columns[: len(node.groups)]
        gkeys = tuple(q(g) for g in group_names)
        split = split_aggregates(node.aggs, self.fresh, gkeys, node.arg_types)
        if split is None:  # not decomposable: move raw rows by the group keys (or to the driver)
            moved = (
                self.hash_columns(child, node.groups, node.key_types)
                if node.groups
                else self.to_single(child)
            )
            return Placed(node.with_children((moved.node,)), moved.parts, rows, width)
        extra = split.partial_groups
        partial = Aggregate(
            group_names + tuple(n for n, _ in extra) + tuple(n for n, _ in split.partial),
            child=child.node,
            groups=node.groups + tuple(e for _, e in extra),
            aggs=tuple(e for _, e in split.partial),
            phase=AggPhase.PARTIAL,
        )
        pp = Placed(partial, child.parts, rows, width)
        moved = self.hash_columns(pp, gkeys, node.key_types) if node.groups else self.to_single(pp)
        before_final: Node = moved.node
        if split.windows:
            before_final = Window(
                before_final.columns + tuple(n for n, _ in split.windows),
                child=before_final,
                exprs=tuple(e for _, e in split.windows),
                partition_keys=gkeys,
            )
        final = Aggregate(
            group_names + tuple(n for n, _ in split.final),
            child=before_final,
            groups=gkeys,
            aggs=tuple(e for _, e in split.final),
            phase=AggPhase.FINAL,
        )
        result = Project(node.columns, child=final, exprs=gkeys + split.result)
        return Placed(result, moved.parts, rows, width)

    def grouping_sets(self, node: Aggregate, child: Placed, rows: float, width: int) -> Placed:
        """GROUPING SETS: each rank aggregates by the finest grouping (every group expression), the
        driver combines those partials per grouping set. The empty set needs every row, so the
        partials meet on the driver; aggregates that do not combine bring their raw rows there."""
        sets = node.grouping_sets or ()
        grouping = "sets" if len(sets) > 1 else "groups" if node.groups else "none"
        group_names = node.columns[: len(node.groups)]
        gkeys = tuple(q(g) for g in group_names)
        finals = tuple(zip(node.groups, gkeys, strict=True))
        split = split_aggregates(node.aggs, self.fresh, (), node.arg_types, grouping, finals)
        if split is None or split.windows or split.partial_groups:
            moved = self.to_single(child)
            return Placed(node.with_children((moved.node,)), moved.parts, rows, width)
        partial = Aggregate(
            group_names + tuple(n for n, _ in split.partial),
            child=child.node,
            groups=node.groups,
            aggs=tuple(e for _, e in split.partial),
            phase=AggPhase.PARTIAL,
        )
        moved = self.to_single(Placed(partial, child.parts, rows, width))
        final = Aggregate(
            group_names + tuple(n for n, _ in split.final),
            child=moved.node,
            groups=gkeys,
            aggs=tuple(e for _, e in split.final),
            phase=AggPhase.FINAL,
            grouping_sets=node.grouping_sets,
        )
        result = Project(node.columns, child=final, exprs=gkeys + split.result)
        return Placed(result, (Single(),), rows, width)

    def hash_columns(self, p: Placed, keys: tuple[str, ...], types: tuple[str, ...] = ()) -> Placed:
        """Hash exchange on key expressions of one relation, cast to their canonical ``types`` so the
        result is partitioned like a join on those keys would want it (reusable); without types the
        keys are hashed as they are (an empty hash type means: no cast)."""
        names = tuple(k[1:-1] if _is_column(k) else None for k in keys)
        types = types or tuple("" for _ in keys)
        return self.hash_to(p, keys, Hashed(names, types, self.size))

    def distinct(self, node: Distinct) -> Placed:
        child = self.place(node.child)
        cols = {q(c) for c in node.columns}
        if child.single or self.size == 1 or any(_keys_within(p, cols) for p in child.parts):
            return Placed(node.with_children((child.node,)), child.parts, child.rows, child.width)
        local = Placed(Distinct(node.columns, child=child.node), child.parts, child.rows, child.width)
        moved = self.hash_columns(local, tuple(q(c) for c in node.columns), node.key_types)
        return Placed(node.with_children((moved.node,)), moved.parts, child.rows, child.width)

    def window(self, node: Window) -> Placed:
        """Rows of one PARTITION BY group must meet on one rank; without PARTITION BY, on the driver."""
        child = self.place(node.child)
        keys = node.partition_keys
        if child.single or self.size == 1 or (keys and any(_keys_within(p, set(keys)) for p in child.parts)):
            moved = child
        elif keys:
            moved = self.hash_columns(child, keys, node.key_types)
        else:
            moved = self.to_single(child)
        return Placed(
            node.with_children((moved.node,)), moved.parts, child.rows, child.width + 8 * len(node.exprs)
        )

    def set_op(self, node: SetOp) -> Placed:
        left, right = self.place(node.left), self.place(node.right)
        rows, width = left.rows + right.rows, max(left.width, right.width)
        if self.size == 1 or (left.replicated and right.replicated):
            parts = (Single(),) if self.size == 1 else (Replicated(),)
            return Placed(node.with_children((left.node, right.node)), parts, rows, width)
        if node.kind is SetOpKind.UNION and node.all and not (left.single or right.single):
            return Placed(node.with_children((left.node, right.node)), (Arbitrary(),), rows, width)
        if (node.kind is SetOpKind.UNION and node.all) or left.single or right.single:
            lp, rp = self.to_single(left), self.to_single(right)
            return Placed(node.with_children((lp.node, rp.node)), (Single(),), rows, width)
        # Distinct set operations: equal rows must meet, so hash both sides on all columns.
        target = Hashed(node.columns, node.key_types, self.size)
        lp = self.hash_to(left, tuple(q(c) for c in left.node.columns), target)
        rp = self.hash_to(right, tuple(q(c) for c in right.node.columns), target)
        return Placed(node.with_children((lp.node, rp.node)), (target,), rows, width)

    def sort_or_limit(self, node: Sort | Limit) -> Placed:
        child = self.place(node.child)
        if child.single or self.size == 1:
            return Placed(node.with_children((child.node,)), child.parts, child.rows, child.width)
        if isinstance(node, Sort) and node.limit is None and not node.offset:
            if child.bytes > self.config.range_sort_threshold_bytes:
                return self.range_sort(node, child)
            # The driver merges one key (exec/stages/merge_runs.py); for several it would sort everything
            # again, and the ranks' sorts would be wasted.
            several_processes = self.per_process < self.size or self.config.merge_sort_in_process
            if len(node.keys) == 1 and several_processes:
                return self.merge_sort(node, child)
        # Top-k on every rank first: each rank sends at most limit + offset rows to the driver
        # (no more than DuckDB's largest LIMIT, which no rank's rows reach anyway).
        if node.limit is None:
            local = child.node
        else:
            top = min(node.limit + node.offset, _MAX_LIMIT)
            if isinstance(node, Sort):
                local = Sort(child.node.columns, child=child.node, keys=node.keys, limit=top)
            else:
                local = Limit(child.node.columns, child=child.node, limit=top)
        gathered = self.to_single(replace(child, node=local))
        return Placed(node.with_children((gathered.node,)), (Single(),), child.rows, child.width)

    def merge_sort(self, node: Sort, child: Placed) -> Placed:
        """Every rank sorts its rows, the driver merges the sorted runs gathered in rank order: no
        process sorts the whole result, whatever its estimated size (config.merge_sort_in_process)."""
        est = (child.rows, child.bytes)
        local = Sort(child.node.columns, child=child.node, keys=node.keys)
        gathered = Exchange(
            local.columns, child=local, kind=ExchangeKind.GATHER, target=Single(), ordered=True, est=est
        )
        merged = replace(node, child=gathered, merge=True)
        return Placed(merged, (Single(),), child.rows, child.width)

    def range_sort(self, node: Sort, child: Placed) -> Placed:
        """Sort in parallel (the sort-merge join's partitioning phase): rows go to ranks by sampled
        splitters of the sort key, every rank sorts its range, the driver concatenates in rank order."""
        est = (child.rows, child.bytes)
        ranged = Exchange(
            child.node.columns, child=child.node, kind=ExchangeKind.SORT, keys=node.keys, est=est
        )
        local = Sort(node.columns, child=ranged, keys=node.keys)
        gathered = Exchange(
            node.columns, child=local, kind=ExchangeKind.GATHER, target=Single(), ordered=True, est=est
        )
        return Placed(gathered, (Single(),), child.rows, child.width)


def _generated(node: Values | FunctionScan) -> Placed:
    """Deterministic rows computed whole on every rank."""
    if isinstance(node, Values):
        return Placed(node, (Replicated(),), 1, 8)
    return Placed(node, (Replicated(),), 1000, 8 * len(node.columns))


Side = Literal["left", "right"]
T = TypeVar("T")


def _joined(
    node: Join, left: Placed, right: Placed, parts: tuple[Partitioning, ...], strategy: JoinStrategy
) -> Placed:
    """The join over its placed inputs (exchanges keep their inputs' size estimates)."""
    keeps_right = node.kind.keeps_right_columns
    rows = max(left.rows, right.rows) if keeps_right else left.rows
    width = left.width + (right.width if keeps_right else 0)
    return Placed(replace(node, left=left.node, right=right.node, strategy=strategy), parts, rows, width)


def _by_side(small: Side, big_item: T, small_item: T) -> tuple[T, T]:
    """(left, right) of a pair given as the big side's item and the ``small`` side's."""
    return (big_item, small_item) if small == "right" else (small_item, big_item)


def _keys(node: Join, side: Side) -> tuple[str, ...]:
    return node.left_keys if side == "left" else node.right_keys


def _co_located(node: Join, left: Placed, right: Placed) -> bool:
    """Whether some partitionings of the two sides already place equal plain-column keys alike."""
    named = [
        (a, b, t)
        for a, b, t in zip(node.left_key_cols, node.right_key_cols, node.key_types, strict=True)
        if a is not None and b is not None
    ]
    pairs = [(a, b) for a, b, _ in named]
    types = [t for _, _, t in named]
    return bool(pairs) and any(co_located(lp, rp, pairs, types) for lp in left.parts for rp in right.parts)


def _join_parts(kind: JoinKind, lparts, rparts) -> tuple[Partitioning, ...]:
    if kind in (JoinKind.INNER, JoinKind.CROSS):
        return tuple(lparts) + tuple(rparts)
    if kind.keeps_left_placement:
        return tuple(lparts)
    if kind is JoinKind.RIGHT:
        return tuple(rparts)
    return (Arbitrary(),)


def _is_column(sql: str) -> bool:
    return sql.startswith('"') and sql.endswith('"') and sql.count('"') == 2


def _keys_within(p: Partitioning, cols: set[str]) -> bool:
    """Whether rows equal on ``cols`` (quoted column SQL) are guaranteed to be on one rank."""
    if isinstance(p, Hashed):
        return bool(p.keys) and all(k is not None and q(k) in cols for k in p.keys)
    if isinstance(p, Ranged):
        return p.key is not None and q(p.key) in cols
    return False


def _project_parts(node: Project, parts) -> tuple[Partitioning, ...]:
    """Carry partitionings through a projection that passes the key columns on (maybe renamed)."""
    renames: dict[str, str] = {}
    for e, c in zip(node.exprs, node.columns, strict=True):
        if _is_column(e):
            renames.setdefault(e[1:-1], c)
    out: list[Partitioning] = []
    for p in parts:
        if isinstance(p, Hashed):
            if all(k is not None and k in renames for k in p.keys):
                out.append(Hashed(tuple(renames[k] for k in p.keys if k is not None), p.key_types, p.count))
        elif isinstance(p, Ranged):
            if p.key in renames:
                out.append(replace(p, key=renames[p.key]))
        else:
            out.append(p)
    return tuple(out) or (Arbitrary(),)


def _filtered(node: Node) -> bool:
    """Whether a filter below keeps only some rows (before any exchange: its estimate is a guess)."""
    return any(isinstance(n, Filter) or (isinstance(n, Scan) and n.filter) for n in walk(node))


def _scans_only(node: Node) -> bool:
    return all(isinstance(n, Scan | Filter | Project | Values) for n in walk(node))


def _replicate_scans(node: Node) -> Node:
    if isinstance(node, Scan):
        return replace(node, replicated=True)
    return node.with_children(tuple(_replicate_scans(c) for c in node.children))
