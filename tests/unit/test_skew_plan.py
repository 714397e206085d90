"""Which joins may spread heavy-hitter keys: only where a replicated row is never preserved."""

from __future__ import annotations

import pytest

from duckflock.exchange.kinds import ExchangeKind
from duckflock.plan.kinds import JoinKind, SkewRole
from duckflock.plan.nodes import Aggregate, ExchangeRead, Filter, Limit, Project, Scan, Values
from duckflock.plan.skew import rescannable, spread_side, unmark_misordered
from duckflock.plan.stages import ExchangeSpec, Stage


@pytest.mark.parametrize(
    ("kind", "left", "right", "want"),
    [
        ("inner", 1e6, 1e3, "left"),
        ("inner", 1e3, 1e6, "right"),
        ("left", 1e6, 1e3, "left"),
        ("left", 1e3, 1e6, None),  # the replicated side would be the preserved one
        ("semi", 1e6, 1e3, "left"),
        ("anti", 1e6, 1e3, "left"),
        ("right", 1e3, 1e6, "right"),
        ("right", 1e6, 1e3, None),
        ("full", 1e6, 1e3, None),
        ("asof", 1e6, 1e3, None),
        ("cross", 1e6, 1e3, None),
        ("inner", 5e4, 1e3, None),  # too small for skew to matter
    ],
)
def test_spread_side(kind, left, right, want):
    assert spread_side(JoinKind(kind), left, right, min_rows=100_000) == want


SPREAD, REPLICATE = SkewRole.SPREAD, SkewRole.REPLICATE


def _stage(sid: int, role: SkewRole, group: str = "g") -> Stage:
    spec = ExchangeSpec(sid, ExchangeKind.HASH, ("k",), None, sid, skew=role, skew_group=group)
    return Stage(sid, Values(("x",)), (), spec, False)


def test_pairs_cut_in_the_wrong_order_lose_their_marks():
    good = unmark_misordered([_stage(0, SPREAD), _stage(1, REPLICATE)])
    assert [s.output.skew for s in good] == [SPREAD, REPLICATE]
    swapped = unmark_misordered([_stage(0, REPLICATE), _stage(1, SPREAD)])
    assert [s.output.skew for s in swapped] == [None, None]
    alone = unmark_misordered([_stage(0, SPREAD, "a"), _stage(1, SPREAD), _stage(2, REPLICATE)])
    assert [s.output.skew for s in alone] == [None, SPREAD, REPLICATE]


def _scan(filter: str | None = None) -> Scan:
    return Scan(("k", "v"), table="t", source_columns=("k", "v"), filter=filter)


@pytest.mark.parametrize(
    ("tree", "want"),
    [
        (_scan(), True),
        (
            Project(
                ("k", "w"),
                child=Filter(("k", "v"), child=_scan("v > 1"), condition="v < 9"),
                exprs=("k", "v * 2"),
            ),
            True,
        ),
        (Filter(("k", "v"), child=_scan(), condition="v >= random()"), False),
        (Project(("k", "u"), child=_scan(), exprs=("k", "gen_random_uuid()")), False),
        (_scan("v < epoch(now())"), False),
        (Filter(("k", "v"), child=_scan(), condition="v < CURRENT_TIMESTAMP"), False),
        (Limit(("k", "v"), child=_scan(), limit=5), False),  # which rows depends on the run
        (Aggregate(("k",), child=_scan(), groups=("k",)), False),  # costly to run again
        (ExchangeRead(("k", "v"), xid=3), False),  # its rows are gone once read
    ],
)
def test_rescannable(tree, want):
    """Only a stage that scans, filters and computes, with nothing volatile, may run again for the
    rows of hot keys it left in DuckDB."""
    assert rescannable(tree) == want
