"""Which joins may spread heavy-hitter keys: only where a replicated row is never preserved."""

from __future__ import annotations

import pytest

from duckflock.plan.skew import spread_side


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
    assert spread_side(kind, left, right, min_rows=100_000) == want
