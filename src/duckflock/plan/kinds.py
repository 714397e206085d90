"""The closed vocabularies of a plan. String enums: their values are what EXPLAIN prints and what a
plan carries over the wire, so a member compares equal to (and formats as) its old string."""

from __future__ import annotations

from enum import StrEnum


class JoinKind(StrEnum):
    INNER = "inner"
    LEFT = "left"
    RIGHT = "right"
    FULL = "full"
    SEMI = "semi"
    ANTI = "anti"
    CROSS = "cross"
    ASOF = "asof"
    ASOF_LEFT = "asof_left"

    @property
    def keeps_right_columns(self) -> bool:
        """Semi and anti joins output only the left side's columns."""
        return self not in (JoinKind.SEMI, JoinKind.ANTI)

    @property
    def allows_replicated_right(self) -> bool:
        """Correct with the whole right side on every rank and the left split: each left row is
        matched exactly once and no unmatched right row is emitted. An ASOF match is the nearest
        right row of the same equality keys, so its right side is whole or placed by those keys."""
        return self in _REPLICATED_RIGHT_OK

    @property
    def allows_replicated_left(self) -> bool:
        """Correct with the whole left side on every rank and the right split."""
        return self in (JoinKind.INNER, JoinKind.RIGHT, JoinKind.CROSS)

    @property
    def keeps_left_placement(self) -> bool:
        """Every output row is a left row (extended): its placement carries over."""
        return self in _KEEPS_LEFT

    @property
    def filters_right_after(self) -> bool:
        """A filter on the right side alone must wait until after the join: the join NULL-extends
        that side (left, full) or matches against all of its rows (ASOF)."""
        return self in (JoinKind.LEFT, JoinKind.FULL, JoinKind.ASOF, JoinKind.ASOF_LEFT)

    @property
    def filters_left_after(self) -> bool:
        """A filter on the left side alone must wait until after the join: it NULL-extends it."""
        return self in (JoinKind.RIGHT, JoinKind.FULL)


_REPLICATED_RIGHT_OK = frozenset(
    (
        JoinKind.INNER,
        JoinKind.LEFT,
        JoinKind.SEMI,
        JoinKind.ANTI,
        JoinKind.CROSS,
        JoinKind.ASOF,
        JoinKind.ASOF_LEFT,
    )
)
_KEEPS_LEFT = frozenset((JoinKind.LEFT, JoinKind.SEMI, JoinKind.ANTI, JoinKind.ASOF, JoinKind.ASOF_LEFT))


class JoinStrategy(StrEnum):
    """How distribution placed a join's inputs (shown in EXPLAIN)."""

    LOCAL = "local"
    LOCAL_ON_DRIVER = "local on driver"
    CO_LOCATED = "co-located"
    RIGHT_REPLICATED = "right replicated"
    LEFT_REPLICATED = "left replicated"
    BROADCAST_RIGHT = "broadcast right"
    BROADCAST_LEFT = "broadcast left"
    # A measured broadcast that is hashed into the other side's partitioning when too large.
    BROADCAST_RIGHT_ELSE_SHUFFLE = "broadcast right, else shuffle right"
    BROADCAST_LEFT_ELSE_SHUFFLE = "broadcast left, else shuffle left"
    SHUFFLE_RIGHT = "shuffle right"
    SHUFFLE_LEFT = "shuffle left"
    SHUFFLE_BOTH = "shuffle both"
    GATHER_BOTH = "gather both"
    LATERAL = "lateral over replicated inputs"


class SkewRole(StrEnum):
    """What a join's hash exchange does with the rows of heavy-hitter keys (plan/skew.py)."""

    SPREAD = "spread"  # dealt round-robin over all ranks
    REPLICATE = "replicate"  # sent to every rank

    @property
    def describe(self) -> str:
        return "spread over" if self is SkewRole.SPREAD else "replicated to"


class SetOpKind(StrEnum):
    UNION = "union"
    INTERSECT = "intersect"
    EXCEPT = "except"


class AggPhase(StrEnum):
    """Where an Aggregate sits in a two-phase aggregation."""

    SINGLE = "single"  # all of a group's rows are in one place: computed once
    PARTIAL = "partial"  # per rank, over its rows; combined by the FINAL one after an exchange
    FINAL = "final"
