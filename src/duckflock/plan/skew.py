"""Joins that spread heavy-hitter keys: which shuffled joins may, and how their exchanges are marked.

In a join whose sides are both hashed on the keys, a key holding a large share of one side sends all
those rows to one rank. Instead, the rows of the bigger side ("spread") whose key is hot are dealt
over all ranks, and the other side's rows with that key are sent to every rank ("replicate"); all
other keys are hashed as before. The hot keys are found at run time (``exec/stages/skew.py``).

Each spread row meets every matching replicated row on exactly one rank, so every matching pair is
produced once. A spread row also sees all its matches there, so it may be the preserved side: exact
for INNER, and for LEFT/SEMI/ANTI when the spread side is the left one, RIGHT when it is the right
one. A replicated row is on every rank, so it must never be preserved: FULL never qualifies, nor
ASOF (nearest match per rank), CROSS or LATERAL joins (no hashed keys).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from duckflock.catalog.partitioning import Hashed, Ranged
from duckflock.plan.kinds import JoinKind, JoinStrategy, SkewRole
from duckflock.plan.nodes import (
    Exchange,
    Filter,
    FunctionScan,
    Join,
    Node,
    Project,
    Scan,
    Values,
    volatile,
    walk,
)

if TYPE_CHECKING:
    from duckflock.plan.distribute import Placed
    from duckflock.plan.stages import Stage

Side = Literal["left", "right"]

# The join kinds where each side may be the spread one (the other side is never preserved).
_SPREADABLE: dict[JoinKind, tuple[Side, ...]] = {
    JoinKind.INNER: ("left", "right"),
    JoinKind.LEFT: ("left",),
    JoinKind.SEMI: ("left",),
    JoinKind.ANTI: ("left",),
    JoinKind.RIGHT: ("right",),
}

# The most a staying side may weigh, next to the moved one, to be sent through an exchange for the
# sake of its hot keys: a staying side near the moved one's size, held whole as Arrow on the
# receiving ranks, multiplies the join's memory; a small one is cheap to send.
STAYING_SHARE = 1 / 8

# The side each shuffle strategy hashes (both for a shuffle of both sides).
_MOVED: dict[JoinStrategy, Side | Literal["both"]] = {
    JoinStrategy.SHUFFLE_LEFT: "left",
    JoinStrategy.SHUFFLE_RIGHT: "right",
    JoinStrategy.SHUFFLE_BOTH: "both",
}


def spread_side(kind: JoinKind, left_rows: float, right_rows: float, min_rows: int) -> Side | None:
    """The side whose hot keys may be spread: the bigger one by estimated rows, if the kind allows
    it and that side is large enough for skew to matter."""
    big: Side = "left" if left_rows >= right_rows else "right"
    if big not in _SPREADABLE.get(kind, ()) or max(left_rows, right_rows) < min_rows:
        return None
    return big


def mark(left: Node, right: Node, spread: Side, group: str) -> tuple[Node, Node]:
    """Both hash exchanges of a join marked: ``spread`` side spreads hot keys, the other replicates
    them; ``group`` names the pair, so the replicating side finds the hot keys the spreading side chose."""
    assert isinstance(left, Exchange) and isinstance(right, Exchange)
    spread_first = (SkewRole.SPREAD, SkewRole.REPLICATE)
    roles = spread_first if spread == "left" else spread_first[::-1]
    return (
        replace(left, skew=roles[0], skew_group=group),
        replace(right, skew=roles[1], skew_group=group),
    )


def spread_hot_keys(
    node: Join,
    left: Placed,
    right: Placed,
    strategy: JoinStrategy,
    pairs: tuple[int, ...],
    min_rows: int,
    fresh: Callable[[str], str],
) -> tuple[Node, Node] | None:
    """The (left, right) inputs of a join with their exchanges marked to spread hot keys, or None
    where that is not exact or not worth it: only shuffles (of one side or both) qualify. ``pairs``:
    for a side shuffled into the other's placement, the join's equi pairs its exchange keys are of."""
    moved = _MOVED.get(strategy)
    if moved is None:
        return None
    if moved == "both":
        side = spread_side(node.kind, left.rows, right.rows, min_rows)
        return None if side is None else mark(left.node, right.node, side, fresh("skew"))
    return spread_moved(node, left, right, moved, pairs, min_rows, fresh)


def spread_moved(
    node: Join,
    left: Placed,
    right: Placed,
    moved: Side,
    pairs: tuple[int, ...],
    min_rows: int,
    fresh: Callable[[str], str],
) -> tuple[Node, Node] | None:
    """For a join that sends only the ``moved`` side into the other side's placement (hashed or by
    ranges): both sides marked, the staying side now sent too — into its own placement, so its rows
    stay on their rank (handed over locally) except those of hot keys, which go to every rank. None
    when the moved side is not the one to spread (see ``spread_side``) or is not placed so."""
    mover, stay = (left, right) if moved == "left" else (right, left)
    ex = mover.node
    if not isinstance(ex, Exchange) or not isinstance(ex.target, Hashed | Ranged) or ex.local:
        return None
    if stay.bytes > mover.bytes * STAYING_SHARE:
        return None  # the staying side would cross an exchange whole, for a skew it may not have
    if spread_side(node.kind, left.rows, right.rows, min_rows) != moved:
        return None
    stay_keys = node.right_keys if moved == "left" else node.left_keys
    stay_cols = node.right_key_cols if moved == "left" else node.left_key_cols
    # Each moved key's partner in its equi pair (not found by its text: one key may be in several
    # pairs, with partners of different values): equal keys meet in the same partition.
    target: Hashed | Ranged
    if isinstance(ex.target, Hashed):
        target = Hashed(tuple(stay_cols[j] for j in pairs), ex.target.key_types, ex.target.count)
    else:
        target = replace(ex.target, key=stay_cols[pairs[0]])
    kept = Exchange(
        stay.node.columns,
        child=stay.node,
        kind=ex.kind,
        target=target,
        keys=tuple(stay_keys[j] for j in pairs),
        est=(stay.rows, stay.bytes),
    )
    lnode, rnode = (ex, kept) if moved == "left" else (kept, ex)
    return mark(lnode, rnode, moved, fresh("skew"))


def child_order(node: Node) -> tuple[int, ...]:
    """The order in which to cut a node's children into stages: a spreading exchange first, because
    the stage producing the replicating side needs the hot keys it found."""
    if isinstance(node, Join) and isinstance(node.right, Exchange) and node.right.skew is SkewRole.SPREAD:
        return (1, 0)
    return tuple(range(len(node.children)))


def unmark_misordered(stages: list[Stage]) -> list[Stage]:
    """The stages with the marks of any pair dropped whose spreading stage does not come before its
    replicating one (``child_order`` sees to that; this is the safety net): the replicating stage
    would not know the hot keys yet. Without marks both sides are hashed, which is always exact."""
    spread_seen: set[str] = set()
    bad: set[str] = set()
    roles: dict[str, set[SkewRole]] = {}
    for stage in stages:
        spec = stage.output
        if spec is None or spec.skew is None:
            continue
        roles.setdefault(spec.skew_group, set()).add(spec.skew)
        if spec.skew is SkewRole.SPREAD:
            spread_seen.add(spec.skew_group)
        elif spec.skew_group not in spread_seen:
            bad.add(spec.skew_group)
    bad |= {g for g, r in roles.items() if r != set(SkewRole)}
    return [
        replace(s, output=replace(s.output, skew=None, skew_group=""))
        if s.output is not None and s.output.skew_group in bad
        else s
        for s in stages
    ]


def rescannable(root: Node) -> bool:
    """Whether a stage's rows (tree ``root``) come out the same when a later stage of the query
    renders and runs ``root`` again on the same rank: it only reads this rank's tables, filters and
    computes, with nothing volatile. Then a spreading stage may leave the rows of hot keys it would
    keep on its own rank inside DuckDB, for the join's stage to read again (exec/stages/skew.py)."""
    nodes = list(walk(root))
    if not all(isinstance(n, Scan | Filter | Project | FunctionScan | Values) for n in nodes):
        return False
    return not volatile(root)
