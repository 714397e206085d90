"""Which stage reads its input as a stream while the stage before it still runs (plan/streaming.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from duckflock.catalog import Catalog
from duckflock.catalog.catalog import PartitionInfo, TableInfo
from duckflock.catalog.partitioning import Hashed
from duckflock.exchange.kinds import ExchangeKind
from duckflock.plan.kinds import JoinKind, SkewRole
from duckflock.plan.nodes import Aggregate, ExchangeRead, Filter, Join, Scan, Values
from duckflock.plan.stages import ExchangeSpec, Stage, StagePlan
from duckflock.plan.streaming import fixed_join_order, probe_first, streamed_input

COLS = ("a",)


def _plan(consumer_root, big=1e6, small=1e3, kind=ExchangeKind.HASH, small_skew=None, **spec) -> StagePlan:
    """Stage 0 sends the small side (x0), stage 1 the big one (x1), stage 2 reads both."""
    x0 = ExchangeSpec(0, ExchangeKind.HASH, COLS, None, 0, est=(small, small * 8), skew=small_skew)
    x1 = ExchangeSpec(1, kind, COLS, None, 1, est=(big, big * 8), **spec)
    out = ExchangeSpec(2, ExchangeKind.GATHER, (), None, 2)
    stages = (
        Stage(0, Values(COLS), (), x0, False),
        Stage(1, Values(COLS), (), x1, False),
        Stage(2, consumer_root, (0, 1), out, False),
        Stage(3, ExchangeRead(COLS, xid=2), (2,), None, True),
    )
    return StagePlan(stages, COLS, pa.schema([("a", pa.int64())]))


def _join(left, right, kind=JoinKind.INNER):
    return Join(COLS, left=left, right=right, kind=kind, left_keys=COLS, right_keys=COLS)


BIG, SMALL = ExchangeRead(COLS, xid=1), ExchangeRead(COLS, xid=0)
CATALOG = Catalog(".", {})


@pytest.mark.parametrize("kind", [JoinKind.INNER, JoinKind.LEFT, JoinKind.SEMI, JoinKind.ANTI])
def test_probe_side_streams(kind):
    root = Aggregate(COLS, child=_join(Filter(COLS, child=BIG, condition="a > 0"), SMALL, kind))
    plan = _plan(root)
    assert streamed_input(plan, 2, CATALOG, 2) == 1
    assert fixed_join_order(plan.stages[2])


@pytest.mark.parametrize(
    ("root", "plan_args"),
    [
        (_join(SMALL, BIG, JoinKind.SEMI), {}),  # the stream would be the build side
        (_join(BIG, SMALL, JoinKind.RIGHT), {}),  # DuckDB builds the left of a RIGHT join
        (_join(BIG, SMALL, JoinKind.FULL), {}),
        (
            _join(BIG, SMALL),
            {"fallback_target": Hashed(("a",), ("BIGINT",), 2), "fallback_above": 1},
        ),  # measured
        (_join(BIG, _join(SMALL, SMALL)), {}),  # a build side with a join of its own
    ],
)
def test_not_streamed(root, plan_args):
    assert streamed_input(_plan(root, **plan_args), 2, CATALOG, 2) is None


def test_a_stream_is_read_once():
    assert streamed_input(_plan(_join(BIG, BIG)), 2, CATALOG, 2) is None


def test_an_aggregate_streams_without_fixing_the_join_order():
    plan = _plan(Aggregate(COLS, child=BIG))
    assert streamed_input(plan, 2, CATALOG, 2) == 1
    assert not fixed_join_order(plan.stages[2])


@pytest.mark.parametrize(
    "spec", [{"kind": ExchangeKind.SORT}, {"skew": SkewRole.SPREAD}, {"small_skew": SkewRole.REPLICATE}]
)
def test_the_producer_alone_may_call_collectives(spec):
    assert streamed_input(_plan(_join(BIG, SMALL), **spec), 2, CATALOG, 2) == 1


def test_stages_in_between_run_meanwhile_unless_they_call_collectives():
    """The big side produced first (x0), the small side's stage between it and the join."""

    def plan(between_skew):
        x0 = ExchangeSpec(0, ExchangeKind.HASH, COLS, None, 0, est=(1e6, 8e6))
        x1 = ExchangeSpec(1, ExchangeKind.HASH, COLS, None, 1, est=(1e3, 8e3), skew=between_skew)
        root = _join(ExchangeRead(COLS, xid=0), ExchangeRead(COLS, xid=1))
        stages = (
            Stage(0, Values(COLS), (), x0, False),
            Stage(1, Values(COLS), (), x1, False),
            Stage(2, root, (0, 1), ExchangeSpec(2, ExchangeKind.GATHER, (), None, 2), False),
        )
        return StagePlan(stages, COLS, pa.schema([("a", pa.int64())]))

    assert streamed_input(plan(None), 2, CATALOG, 2) == 0
    assert streamed_input(plan(SkewRole.REPLICATE), 2, CATALOG, 2) == 0  # waits for the hot keys
    assert streamed_input(plan(SkewRole.SPREAD), 2, CATALOG, 2) is None  # a collective


@pytest.mark.parametrize(
    ("kind", "swapped"), [(JoinKind.INNER, JoinKind.INNER), (JoinKind.RIGHT, JoinKind.LEFT)]
)
def test_a_stream_on_the_right_is_written_first(kind, swapped):
    plan = _plan(_join(SMALL, BIG, kind))
    assert streamed_input(plan, 2, CATALOG, 2) == 1
    join = probe_first(plan.stages[2].root, 1)
    assert isinstance(join, Join) and (join.left, join.right, join.kind) == (BIG, SMALL, swapped)


def test_the_larger_input_by_the_estimates_streams():
    assert streamed_input(_plan(_join(BIG, SMALL), big=10.0), 2, CATALOG, 2) == 0


def test_no_stream_through_a_build_side_larger_than_duckdbs_memory():
    """A build side that would spill runs in partition runs instead, which a stream cannot."""
    plan = _plan(_join(BIG, SMALL))  # each rank gets 500 rows, 4,000 bytes, of the build side
    assert streamed_input(plan, 2, CATALOG, 2, memory_bytes=4_000) == 1
    assert streamed_input(plan, 2, CATALOG, 2, memory_bytes=3_999) is None


def test_no_stream_of_an_input_too_small_to_bound_memory():
    """Each rank gets 500,000 rows, 4,000,000 bytes, of the stream."""
    plan = _plan(_join(BIG, SMALL))
    assert streamed_input(plan, 2, CATALOG, 2, min_bytes=4_000_000) == 1
    assert streamed_input(plan, 2, CATALOG, 2, min_bytes=4_000_001) is None


def test_a_table_build_side_counts_its_rows_on_the_rank_times_its_width():
    """A table as the build side: its largest share on a rank (1,000 BIGINT rows, 8,000 bytes)."""
    parts = (PartitionInfo(("p0.parquet",), 1000), PartitionInfo(("p1.parquet",), 10))
    table = TableInfo("t", "parquet", (("a", "BIGINT"), ("s", "VARCHAR")), parts)
    catalog = Catalog(".", {"t": table})
    plan = _plan(_join(BIG, Scan(COLS, table="t", source_columns=("a",))))
    assert streamed_input(plan, 2, catalog, 2, memory_bytes=8_000) == 1
    assert streamed_input(plan, 2, catalog, 2, memory_bytes=7_999) is None
