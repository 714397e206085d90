"""The distributed planner: join strategies from the catalog, aggregate splitting, top-k, refusals."""

from __future__ import annotations

import logging
from pathlib import Path

import duckdb
import pytest

from duckflock.catalog import Catalog, Hashed, Ranged
from duckflock.catalog.partitioning import canonical_hash_type
from duckflock.catalog.placement import target_sql
from duckflock.config import Config
from duckflock.errors import CatalogError, DuckflockError, InternalError, NotDistributed, SqlError
from duckflock.exec.stages import adaptive
from duckflock.plan.explain import explain_plan
from duckflock.plan.nodes import Aggregate, ExchangeRead, Join, Node, Scan, SetOp, Sort, Window, walk
from duckflock.plan.planner import plan_query
from duckflock.plan.stages import ExchangeSpec, OnDriver, StagePlan
from duckflock.sql import builder
from duckflock.sql.schema_db import SchemaDB
from support import make_table

N = 4000  # rows of the big tables


@pytest.fixture(scope="module")
def catalog(tmp_path_factory) -> Catalog:
    root: Path = tmp_path_factory.mktemp("planner")
    big = f"FROM range({N}) t(i)"
    make_table(root, "hk", f"SELECT i::BIGINT AS k, i % 10 AS v, 'x' || i AS s {big}", 4, "hash", ("k",))
    make_table(root, "hi", f"SELECT i::INTEGER AS k, i % 7 AS v {big}", 4, "hash", ("k",))
    make_table(root, "h3", f"SELECT i::BIGINT AS k, i % 5 AS v {big}", 3, "hash", ("k",))
    make_table(root, "hv", f"SELECT i::BIGINT AS k, (i % 10)::BIGINT AS v {big}", 4, "hash", ("v",))
    # Aligned ranges: each key range [0, 999], [1000, 1999], ... on both; rc is shifted by 500.
    make_table(root, "ra", f"SELECT i::BIGINT AS k, i AS a {big}", 4, "range", ("k",))
    make_table(
        root, "rb", f"SELECT (i // 2)::BIGINT AS k, i AS b FROM range({2 * N}) t(i)", 4, "range", ("k",)
    )
    make_table(root, "rc", f"SELECT (i + 500)::BIGINT AS k, i AS c {big}", 4, "range", ("k",))
    make_table(root, "rint", f"SELECT i::INTEGER AS k, i AS a {big}", 4, "range", ("k",))
    make_table(root, "bigv", f"SELECT (i * 1000000)::BIGINT AS k, i AS w {big}", 4)
    make_table(root, "one", "SELECT i::BIGINT AS k, 'n' || i AS name FROM range(10) t(i)", 1)
    make_table(root, "tiny", "SELECT i::BIGINT AS k, 'n' || i AS name FROM range(20) t(i)", 4)
    make_table(root, "flags", "SELECT (i % 2 = 0) AS b, i AS x FROM range(100) t(i)", 4)
    make_table(root, "words", "SELECT 'w' || i AS s, (i % 3)::INTEGER AS n FROM range(100) t(i)", 4)
    make_table(root, "ua", f"SELECT (i * 3 % {N})::BIGINT AS k, i % 10 AS v {big}", 4)
    make_table(root, "ub", f"SELECT (i * 7 % {N})::BIGINT AS k, i % 9 AS w {big}", 4)
    make_table(root, "mid", "SELECT i::BIGINT AS k, i AS w FROM range(1500) t(i)", 4)  # 3/8 of ua's bytes
    return Catalog.load(root)


@pytest.fixture(scope="module")
def schema_db(catalog):
    db = SchemaDB(catalog)
    yield db
    db.close()


@pytest.fixture
def plan(catalog, schema_db):
    def run(sql: str, size: int = 4, per_process: int = 1, cores: int = 2, **config) -> StagePlan:
        return plan_query(sql, catalog, schema_db, size, Config(**config), per_process, cores)

    return run


def nodes(p: StagePlan, kind: type, shuffled: frozenset[int] = frozenset()) -> list:
    """Nodes of the plan that runs when the measured broadcasts ``shuffled`` (default: none) fell back."""
    return [
        n
        for s in p.stages
        if adaptive.runs(s, set(shuffled))
        for n in walk(adaptive.resolve(s.root, set(shuffled)))
        if isinstance(n, kind)
    ]


def the_join(p: StagePlan) -> Join:
    joins = nodes(p, Join)
    assert len(joins) == 1, joins
    return joins[0]


def exchange_kinds(p: StagePlan) -> list[str]:
    return [s.output.kind for s in p.stages if s.output is not None]


def feeding(p: StagePlan, child: Node) -> ExchangeSpec | None:
    """The exchange that delivers a join input, or None when it is read in place."""
    return p.exchange(child.xid) if isinstance(child, ExchangeRead) else None


def scans(node: Node) -> list[Scan]:
    return [n for n in walk(node) if isinstance(n, Scan)]


# ---- co-located joins ---------------------------------------------------------------------------


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT a.v, b.v FROM hk a JOIN hi b ON a.k = b.k",  # BIGINT vs INTEGER keys
        "SELECT a.v, b.v FROM hi a JOIN hk b ON b.k = a.k",
        "SELECT a.s, b.v FROM hk a JOIN hk b ON a.k = b.k",
        "SELECT a.v, b.v FROM hk a JOIN hi b ON a.k = b.k AND a.v = b.v",  # partitioned on a subset
        "SELECT a.v, b.v FROM hk a LEFT JOIN hi b ON a.k = b.k",
        "SELECT ra.a, rb.b FROM ra JOIN rb ON ra.k = rb.k",  # aligned ranges
        "SELECT ra.a, rb.b FROM rb JOIN ra ON ra.k = rb.k",
    ],
)
@pytest.mark.parametrize("threshold", [0, 1 << 30])
def test_co_located_joins_move_no_rows(plan, sql, size, threshold):
    p = plan(sql, size, broadcast_threshold_bytes=threshold)
    j = the_join(p)
    assert j.strategy == "co-located"
    assert exchange_kinds(p) == ["gather"]  # only the result goes to the driver
    assert not any(s.replicated for s in nodes(p, Scan))


def _moved_and_kept(p: StagePlan, j: Join) -> tuple[ExchangeSpec, Node]:
    """The exchange feeding the shuffled side of a one-sided shuffle, and the side that stays."""
    left, right = feeding(p, j.left), feeding(p, j.right)
    assert (left is None) != (right is None), (left, right)
    return (left, j.right) if left is not None else (right, j.left)


def test_hash_with_a_different_partition_count_is_not_co_located(plan, catalog):
    p = plan("SELECT a.v, b.v FROM hk a JOIN h3 b ON a.k = b.k", broadcast_threshold_bytes=0)
    j = the_join(p)
    assert j.strategy in ("shuffle left", "shuffle right")
    moved, kept = _moved_and_kept(p, j)
    # The moved side is hashed into exactly the stored partitioning of the side that stays.
    [table] = {s.table for s in scans(kept)}
    stored = catalog.table(table).partitioning()
    assert moved.kind == "hash"
    assert isinstance(moved.target, Hashed)
    assert (moved.target.count, moved.target.key_types) == (stored.count, stored.key_types)


def test_misaligned_ranges_are_not_co_located(plan, catalog):
    p = plan("SELECT ra.a, rc.c FROM ra JOIN rc ON ra.k = rc.k", broadcast_threshold_bytes=0)
    j = the_join(p)
    assert j.strategy in ("shuffle left", "shuffle right")
    moved, kept = _moved_and_kept(p, j)
    assert moved.kind == "range"
    assert isinstance(moved.target, Ranged)
    [table] = {s.table for s in scans(kept)}
    assert moved.target.bounds == tuple((q.min, q.max) for q in catalog.table(table).partitions)


def test_join_on_a_column_other_than_the_partition_key_is_not_co_located(plan):
    p = plan("SELECT hv.v, hk.s FROM hv JOIN hk ON hv.k = hk.k", broadcast_threshold_bytes=0)
    j = the_join(p)
    assert j.strategy == "shuffle left"  # hv is hashed on v, not on the join key: it moves
    spec = feeding(p, j.left)
    assert spec is not None and spec.kind == "hash"
    assert spec.target == Hashed(("hv.k",), ("BIGINT",), 4)
    assert feeding(p, j.right) is None


# ---- shuffles -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "strategy", "moved_table"),
    [
        ("SELECT ua.v, hk.s FROM ua JOIN hk ON ua.k = hk.k", "shuffle left", "ua"),
        ("SELECT ua.v, hk.s FROM hk JOIN ua ON ua.k = hk.k", "shuffle right", "ua"),
        ("SELECT ua.v, hi.v FROM ua JOIN hi ON ua.k = hi.k", "shuffle left", "ua"),  # INTEGER partition key
    ],
)
@pytest.mark.parametrize("size", [3, 4])
def test_only_the_side_not_partitioned_on_the_key_is_shuffled(plan, sql, strategy, moved_table, size):
    p = plan(sql, size, broadcast_threshold_bytes=0)
    j = the_join(p)
    assert j.strategy == strategy
    moved, kept = (j.left, j.right) if strategy == "shuffle left" else (j.right, j.left)
    spec = feeding(p, moved)
    assert spec is not None and spec.kind == "hash"
    assert {s.table for s in scans(p.stage(spec.producer).root)} == {moved_table}
    # Into the stored table's own function: same count, same hash types.
    assert spec.target.count == 4
    assert spec.target.key_types == (canonical_hash_type("BIGINT"),)
    assert feeding(p, kept) is None


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("kind", ["JOIN", "LEFT JOIN", "FULL JOIN"])
def test_two_unpartitioned_big_sides_are_both_shuffled(plan, size, kind):
    p = plan(f"SELECT ua.v, ub.w FROM ua {kind} ub ON ua.k = ub.k", size, broadcast_threshold_bytes=0)
    j = the_join(p)
    assert j.strategy == "shuffle both"
    left, right = feeding(p, j.left), feeding(p, j.right)
    assert left.kind == right.kind == "hash"
    assert left.target.count == right.target.count == size
    assert left.target.key_types == right.target.key_types


# ---- broadcasts and replicated scans ------------------------------------------------------------


@pytest.mark.parametrize("small", ["one", "tiny"])
def test_small_side_is_read_by_every_rank_from_shared_storage(plan, small):
    p = plan(f"SELECT ua.v, {small}.name FROM ua JOIN {small} ON ua.k = {small}.k")
    j = the_join(p)
    assert j.strategy in ("broadcast right", "right replicated")
    assert [s.replicated for s in scans(j.right)] == [True]
    assert [s.replicated for s in scans(j.left)] == [False]
    assert exchange_kinds(p) == ["gather"]


@pytest.mark.parametrize("small", ["one", "tiny"])
def test_small_side_is_broadcast_without_shared_storage(plan, small):
    p = plan(f"SELECT ua.v, {small}.name FROM ua JOIN {small} ON ua.k = {small}.k", shared_storage=False)
    j = the_join(p)
    assert j.strategy == "broadcast right"
    spec = feeding(p, j.right)
    assert spec is not None and spec.kind == "broadcast"
    assert not any(s.replicated for s in nodes(p, Scan))


def test_a_broadcast_has_a_prepared_shuffle_for_when_it_is_too_large(plan):
    """A broadcast side is measured at run time; above the threshold both sides are hashed on the
    join keys instead, by stages prepared in the plan that run only then."""
    p = plan("SELECT ua.v, tiny.name FROM ua JOIN tiny ON ua.k = tiny.k", shared_storage=False)
    spec = feeding(p, the_join(p).right)
    assert spec is not None and spec.kind == "broadcast" and isinstance(spec.fallback_target, Hashed)
    assert spec.fallback_above == Config().broadcast_threshold_bytes
    [shuffled] = nodes(p, Join, frozenset({spec.xid}))
    assert shuffled.strategy == "shuffle both"
    left = feeding(p, shuffled.left)
    assert left is not None and left.kind == "hash" and isinstance(left.target, Hashed)
    # Hashed alike: same key types and count, each side on its own key column.
    assert left.target.key_types == spec.fallback_target.key_types == ("BIGINT",)
    assert (left.target.keys, spec.fallback_target.keys) == (("ua.k",), ("tiny.k",))
    assert p.stage(left.producer).when == (spec.xid,)


def test_a_broadcast_from_the_driver_falls_back_into_the_other_sides_partitioning(plan):
    """The big side is hashed on the join key already: only the broadcast side would move."""
    p = plan("SELECT hk.v, one.name FROM hk JOIN one ON hk.k = one.k", shared_storage=False)
    spec = feeding(p, the_join(p).right)
    assert spec is not None and spec.kind == "broadcast"
    assert isinstance(spec.fallback_target, Hashed) and spec.fallback_target.keys == ("one.k",)
    assert nodes(p, Join, frozenset({spec.xid})) == [the_join(p)]
    assert all(not s.when for s in p.stages)


# tiny (20 rows) is over this threshold, and four copies of it are far smaller than ua (4,000 rows).
OVER = {"broadcast_threshold_bytes": 64, "shared_storage": False}


def test_a_side_over_the_threshold_is_broadcast_where_copying_it_moves_less(plan):
    """Up to broadcast_max_bytes, a side whose copies on every rank add up to at most half the
    other side is broadcast (measured against that bound), not the other side shuffled."""
    p = plan("SELECT ua.v, tiny.name FROM ua JOIN tiny ON ua.k = tiny.k", broadcast_max_bytes=1 << 20, **OVER)
    spec = feeding(p, the_join(p).right)
    assert spec is not None and spec.kind == "broadcast" and spec.fallback_above == 1 << 20
    # No bound beyond the threshold, or none at all: both sides are hashed.
    for extra in (
        {"broadcast_max_bytes": -1},
        {"broadcast_max_bytes": 1 << 20, "broadcast_threshold_bytes": 0},
    ):
        p = plan("SELECT ua.v, tiny.name FROM ua JOIN tiny ON ua.k = tiny.k", **{**OVER, **extra})
        assert the_join(p).strategy == "shuffle both", extra


def test_a_side_is_not_broadcast_over_the_threshold_when_its_copies_outweigh_the_other(plan):
    """ua and ub are alike in size: four copies of one weigh more than moving the other."""
    p = plan("SELECT ua.v, ub.w FROM ua JOIN ub ON ua.k = ub.k", broadcast_max_bytes=1 << 30, **OVER)
    assert the_join(p).strategy == "shuffle both"


def test_copies_must_weigh_at_most_half_the_other_side(plan):
    """Two copies of mid (3/4 of ua) would move less than ua, but every rank would build all of it."""
    p = plan("SELECT ua.v, mid.w FROM ua JOIN mid ON ua.k = mid.k", 2, broadcast_max_bytes=1 << 20, **OVER)
    assert the_join(p).strategy == "shuffle both"


def test_a_side_over_the_bound_is_not_broadcast_for_being_cheap_to_copy(plan):
    p = plan("SELECT ua.v, tiny.name FROM ua JOIN tiny ON ua.k = tiny.k", broadcast_max_bytes=100, **OVER)
    assert the_join(p).strategy == "shuffle both"


def test_shared_storage_reads_a_side_cheap_to_copy_on_every_rank(plan):
    p = plan(
        "SELECT ua.v, tiny.name FROM ua JOIN tiny ON ua.k = tiny.k",
        broadcast_threshold_bytes=64,
        broadcast_max_bytes=1 << 20,
    )
    j = the_join(p)
    assert j.strategy == "broadcast right" and all(s.replicated for s in scans(j.right))
    assert exchange_kinds(p) == ["gather"]


def test_a_side_read_whole_may_use_the_memory_of_all_ranks_of_a_process(plan, catalog):
    """Over the bound for one rank's copy, within the bound of a process's ranks together: read
    whole where the stage reading it runs once for the process (exec/resources/fused.py), else shuffled."""
    rows = "SELECT ua.v, tiny.name FROM ua JOIN tiny ON ua.k = tiny.k"
    join = "SELECT count(*) AS n, max(ua.v) AS v, max(tiny.name) AS name FROM ua JOIN tiny ON ua.k = tiny.k"
    tiny = catalog.table("tiny")
    cap = int(tiny.rows * tiny.row_width(["k", "name"])) // 3  # 3 of them hold tiny, not 1 or 2
    settings = {"broadcast_threshold_bytes": 64, "broadcast_max_bytes": cap, "fuse_min_bytes": 64}
    p = plan(join, per_process=4, **settings)
    j = the_join(p)
    assert j.strategy == "broadcast right" and all(s.replicated for s in scans(j.right))
    assert [s.once_per_process for s in p.stages] == [True, False]
    for per_process in (1, 2):
        assert the_join(plan(join, per_process=per_process, **settings)).strategy == "shuffle both"
    # Sorted in parallel: the stage of the join is not run once per process, so neither is tiny read.
    p = plan(f"{rows} ORDER BY ua.v, tiny.name", per_process=4, range_sort_threshold_bytes=1, **settings)
    assert the_join(p).strategy == "shuffle both"
    # Nor where its rows are the result as they are (every rank writes its own part file).
    assert the_join(plan(rows, per_process=4, **settings)).strategy == "shuffle both"
    # Nor when tables read whole run once per process only from more bytes than tiny's on.
    p = plan(join, per_process=4, **{**settings, "fuse_min_bytes": 1 << 30})
    assert the_join(p).strategy == "shuffle both"


def test_a_stage_reading_a_table_whole_runs_once_when_the_copies_it_saves_are_large(plan, catalog):
    """``fuse_min_bytes`` weighs the copies saved, one per other rank of the process: tiny's
    columns twice over are saved by a process of 4 ranks (3 copies), not by one of 2 (1 copy)."""
    join = "SELECT count(*) AS n, max(ua.v) AS v, max(tiny.name) AS name FROM ua JOIN tiny ON ua.k = tiny.k"
    tiny = catalog.table("tiny")
    twice = int(2 * tiny.rows * tiny.row_width(["k", "name"]))
    settings = {"broadcast_threshold_bytes": 1 << 30, "broadcast_max_bytes": 1 << 30, "fuse_min_bytes": twice}
    for per_process, once in ((4, True), (2, False)):
        p = plan(join, per_process=per_process, **settings)
        assert the_join(p).strategy == "broadcast right"
        assert [s.once_per_process for s in p.stages] == [once, False]


def test_a_stage_that_only_scans_runs_once_per_process_of_more_ranks_than_cores(plan):
    """A partitioned table scanned (and filtered) into a shuffle: one DuckDB reads the process's
    partitions (exec/resources/fused.py), from ``fuse_min_bytes`` scanned on, where the process's ranks
    outnumber its cores; a stage holding a join's or an aggregate's state runs per rank."""
    join = "SELECT ua.v, ub.w FROM ua JOIN ub ON ua.k = ub.k WHERE ua.v > 2"
    settings = {"broadcast_threshold_bytes": 64, "fuse_min_bytes": 64}
    p = plan(join, per_process=4, cores=2, **settings)
    assert the_join(p).strategy == "shuffle both"
    assert [s.once_per_process for s in p.stages] == [True, True, False, False]  # scans, join, driver
    for per_process, cores, more in ((4, 4, {}), (2, 2, {}), (1, 1, {}), (4, 2, {"fuse_min_bytes": 1 << 30})):
        p = plan(join, per_process=per_process, cores=cores, **{**settings, **more})
        assert not any(s.once_per_process for s in p.stages), (per_process, cores)
    grouped = plan("SELECT v, count(*) AS n FROM ua GROUP BY v", per_process=4, cores=2, **settings)
    assert not any(s.once_per_process for s in grouped.stages)


def test_a_stage_whose_rows_are_the_result_as_they_are_runs_on_every_rank(plan):
    """Each rank writes the rows it produced to its own part file (output=DIR/): run once for a
    process, the stage would leave them all in the first rank's part."""
    settings = {"broadcast_threshold_bytes": 64, "fuse_min_bytes": 64}
    scan = plan("SELECT k, v FROM ua WHERE v > 2", per_process=4, cores=2, **settings)
    assert [s.once_per_process for s in scan.stages] == [False, False]  # into a shuffle, it would run once


def test_the_preserved_side_of_an_outer_join_is_never_broadcast(plan):
    """Broadcasting the preserved side would emit its unmatched rows once per rank."""
    p = plan(
        "SELECT tiny.name, ua.v FROM tiny LEFT JOIN ua ON ua.k = tiny.k", broadcast_threshold_bytes=1 << 30
    )
    j = the_join(p)
    assert j.strategy not in ("broadcast left", "left replicated")
    assert not any(s.replicated for s in scans(j.left))


# ---- one rank -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT ua.v, ub.w FROM ua JOIN ub ON ua.k = ub.k",
        "SELECT v, count(*) FROM ua GROUP BY v ORDER BY v LIMIT 3",
        "SELECT count(DISTINCT k) FROM ua",
    ],
)
def test_one_rank_gives_a_single_stage_without_exchanges(plan, sql):
    p = plan(sql, 1, broadcast_threshold_bytes=0)
    assert len(p.stages) == 1
    assert p.stages[0].output is None and p.stages[0].on_driver
    assert p.stages[0].inputs == ()
    assert all(j.strategy == "local" for j in nodes(p, Join))
    assert all(a.phase == "single" for a in nodes(p, Aggregate))


# ---- aggregates ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [2, 3, 4])
def test_group_by_the_partition_key_needs_no_exchange(plan, size):
    p = plan("SELECT k, count(*), sum(v) FROM hk GROUP BY k", size)
    assert exchange_kinds(p) == ["gather"]
    assert [a.phase for a in nodes(p, Aggregate)] == ["single"]


def test_group_by_another_column_is_partial_then_final_around_a_hash_exchange(plan):
    p = plan("SELECT v, count(*), sum(k), avg(k), min(s) FROM hk GROUP BY v")
    assert exchange_kinds(p) == ["hash", "gather"]
    [producer] = [s for s in p.stages if s.output is not None and s.output.kind == "hash"]
    [consumer] = [s for s in p.stages if producer.output.xid in s.inputs]
    assert [a.phase for a in walk(producer.root) if isinstance(a, Aggregate)] == ["partial"]
    assert [a.phase for a in walk(consumer.root) if isinstance(a, Aggregate)] == ["final"]
    assert isinstance(producer.output.target, Hashed) and producer.output.target.count == 4


def test_global_aggregate_is_partial_then_final_on_the_driver(plan):
    p = plan("SELECT count(*), sum(k) FROM ua")
    assert exchange_kinds(p) == ["gather"]
    phases = {s.on_driver: [a.phase for a in walk(s.root) if isinstance(a, Aggregate)] for s in p.stages}
    assert phases == {False: ["partial"], True: ["final"]}


def test_count_distinct_mixed_with_other_aggregates_is_not_split(plan):
    p = plan("SELECT v, count(DISTINCT k), sum(k) FROM ua GROUP BY v")
    assert exchange_kinds(p) == ["hash", "gather"]
    assert [a.phase for a in nodes(p, Aggregate)] == ["single"]
    # Raw rows cross the exchange: the stage feeding the aggregate does not aggregate.
    assert not any(isinstance(n, Aggregate) for n in walk(p.stages[0].root))


@pytest.mark.parametrize(
    ("sql", "kinds"),
    [
        ("SELECT v, count(DISTINCT k) FROM ua GROUP BY v", ["hash", "gather"]),
        ("SELECT count(DISTINCT k), sum(DISTINCT k) FROM ua", ["gather"]),
    ],
)
def test_distinct_aggregates_deduplicate_before_the_shuffle(plan, sql, kinds):
    p = plan(sql)
    assert exchange_kinds(p) == kinds
    partial, final = (
        nodes(p, Aggregate)[::-1] if nodes(p, Aggregate)[0].phase == "final" else nodes(p, Aggregate)
    )
    assert {partial.phase, final.phase} == {"partial", "final"}
    first = [a for a in walk(p.stages[0].root) if isinstance(a, Aggregate)]
    assert first and first[0].phase == "partial" and not first[0].aggs  # GROUP BY keys + value only
    assert any("DISTINCT" in a for a in final.aggs)


# ---- window functions -------------------------------------------------------------------------------


def test_window_partitioned_by_the_partition_key_needs_no_exchange(plan):
    p = plan("SELECT k, sum(v) OVER (PARTITION BY k ORDER BY v) FROM hk")
    assert exchange_kinds(p) == ["gather"]
    [w] = nodes(p, Window)
    assert not p.stage(0).on_driver and w in list(walk(p.stage(0).root))


def test_window_partitioned_by_another_column_shuffles_by_that_column(plan):
    p = plan("SELECT k, sum(v) OVER (PARTITION BY v), rank() OVER (PARTITION BY v ORDER BY k) FROM ua")
    assert exchange_kinds(p) == ["hash", "gather"]
    spec = p.stage(0).output
    assert spec.keys == ('"ua.v"',)
    [w] = nodes(p, Window)
    [consumer] = [s for s in p.stages if spec.xid in s.inputs]
    assert w in list(walk(consumer.root)) and not consumer.on_driver


def test_window_without_partition_by_runs_on_the_driver(plan):
    p = plan("SELECT k, row_number() OVER (ORDER BY v) FROM ua")
    assert exchange_kinds(p) == ["gather"]
    [w] = nodes(p, Window)
    [driver] = [s for s in p.stages if s.on_driver]
    assert w in list(walk(driver.root))


# ---- set operations ----------------------------------------------------------------------------------


def test_union_all_moves_no_rows_until_the_result(plan):
    p = plan("SELECT k FROM ua UNION ALL SELECT k FROM ub")
    assert exchange_kinds(p) == ["gather"]
    [op] = nodes(p, SetOp)
    assert op.all and not p.stage(0).on_driver


@pytest.mark.parametrize("op", ["UNION", "INTERSECT", "EXCEPT", "INTERSECT ALL", "EXCEPT ALL"])
def test_set_operations_hash_both_sides_alike(plan, op):
    p = plan(f"SELECT k, v FROM ua {op} SELECT k, w FROM ub")
    [node] = nodes(p, SetOp)
    left, right = feeding(p, node.left), feeding(p, node.right)
    assert left.kind == right.kind == "hash"
    assert left.target == right.target
    assert len(left.keys) == len(right.keys) == 2


def _set_op_targets(p: StagePlan, size: int, left_values: list[str], right_values: list[str]):
    """Target rank of each value on each side of a one-column set operation, computed by DuckDB
    with the exchange's own target function."""
    [node] = nodes(p, SetOp)
    out = []
    for child, values in ((node.left, left_values), (node.right, right_values)):
        spec = feeding(p, child)
        rel = " UNION ALL ".join(f"SELECT {v} AS {spec.keys[0]}" for v in values)
        out.append(
            [
                r[0]
                for r in duckdb.sql(
                    f"SELECT {target_sql(spec.keys, spec.target, size)} FROM ({rel})"
                ).fetchall()
            ]
        )
    return out


def test_union_of_boolean_and_integer_sends_equal_rows_to_one_rank(plan):
    p = plan("SELECT b FROM flags UNION SELECT n FROM words", 4)
    # DuckDB's own answer: the union's type, and which values it considers the same row.
    assert duckdb.sql("SELECT true UNION SELECT 1::INTEGER").fetchall() == [(1,)]
    left, right = _set_op_targets(p, 4, ["true", "false"], ["1::INTEGER", "0::INTEGER"])
    assert left == right


def test_union_of_varchar_and_integer_computes_targets(plan):
    p = plan("SELECT s FROM words UNION SELECT n FROM words", 4)
    left, right = _set_op_targets(p, 4, ["'w1'", "'7'"], ["7::INTEGER"])
    assert left[1] == right[0]  # '7' and 7 are the same VARCHAR row of the union


# ---- top-k ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("limit", "offset"), [(5, 0), (5, 2), (1, 10)])
def test_order_by_limit_is_a_top_k_on_every_rank_before_the_gather(plan, limit, offset):
    off = f" OFFSET {offset}" if offset else ""
    p = plan(f"SELECT k, v FROM ua ORDER BY v DESC, k LIMIT {limit}{off}")
    assert exchange_kinds(p) == ["gather"]
    [local] = [s for s in p.stages if not s.on_driver]
    [final] = [s for s in p.stages if s.on_driver]
    assert isinstance(local.root, Sort)
    assert local.root.limit == limit + offset and local.root.offset == 0
    assert isinstance(final.root, Sort)
    assert (final.root.limit, final.root.offset) == (limit, offset)
    assert final.root.keys == local.root.keys
    assert isinstance(final.root.child, ExchangeRead)


def test_order_by_without_limit_is_sorted_on_every_rank_and_merged_on_the_driver(plan):
    p = plan("SELECT k, v FROM ua ORDER BY v")
    assert exchange_kinds(p) == ["gather"]
    [local] = [s for s in p.stages if not s.on_driver]
    [final] = [s for s in p.stages if s.on_driver]
    assert local.output is not None and local.output.ordered  # runs arrive in rank order
    assert isinstance(local.root, Sort) and not local.root.merge and local.root.limit is None
    assert isinstance(final.root, Sort) and final.root.merge
    assert final.root.keys == local.root.keys
    assert isinstance(final.root.child, ExchangeRead)


def test_order_by_without_limit_is_sorted_by_the_driver_where_all_ranks_are_its_threads(plan):
    p = plan("SELECT k, v FROM ua ORDER BY v", per_process=4)
    [local] = [s for s in p.stages if not s.on_driver]
    assert not any(isinstance(n, Sort) for n in walk(local.root))
    [sort] = nodes(p, Sort)
    assert not sort.merge and sort.limit is None
    merged = plan("SELECT k, v FROM ua ORDER BY v", per_process=4, merge_sort_in_process=True)
    assert [n.merge for n in nodes(merged, Sort)] == [False, True]


def test_order_by_several_keys_is_sorted_by_the_driver_alone(plan):
    """The driver merges runs on one key; on several it would sort everything again."""
    p = plan("SELECT k, v FROM ua ORDER BY v, k")
    [sort] = nodes(p, Sort)
    assert not sort.merge and sort.limit is None


def test_big_order_by_without_limit_is_a_parallel_range_sort(plan):
    p = plan("SELECT k, v FROM ua ORDER BY v DESC, k", range_sort_threshold_bytes=0)
    assert exchange_kinds(p) == ["sort", "gather"]
    sort_x = next(s.output for s in p.stages if s.output.kind == "sort")
    gather_x = next(s.output for s in p.stages if s.output.kind == "gather")
    assert gather_x.ordered and not sort_x.ordered
    # Every rank sorts its own range; the driver only concatenates in rank order.
    sorter = p.stage(gather_x.producer)
    assert not sorter.on_driver and sorter.inputs == (sort_x.xid,)
    assert isinstance(sorter.root, Sort) and sorter.root.limit is None
    assert sorter.root.keys == sort_x.keys
    [final] = [s for s in p.stages if s.output is None]
    assert not any(isinstance(n, Sort) for n in walk(final.root))


# ---- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        (
            "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 3) SELECT * FROM r",
            "RECURSIVE",
        ),
        ("SELECT DISTINCT ON (k) k, v FROM ua QUALIFY row_number() OVER () > 1", "DISTINCT ON with QUALIFY"),
        ("SELECT * FROM ua, LATERAL generate_series(1, ua.k)", "LATERAL"),
        ("SELECT ua.k FROM ua ASOF RIGHT JOIN ub USING (k)", "ASOF RIGHT JOIN ... USING"),
        ("SELECT k, current_setting('threads') FROM ua", "where it runs"),
        ("SELECT ua.k FROM ua POSITIONAL JOIN ub", "POSITIONAL JOIN"),
        ("SELECT k FROM ua USING SAMPLE 10%", "SAMPLE"),
        ("SELECT k FROM ua UNION SELECT k FROM ub ORDER BY k + (SELECT 1)", "ORDER BY of a set operation"),
    ],
)
def test_unsupported_constructs_are_refused_by_name(plan, sql, named):
    # With the driver fallback off (-1: not even a query over no table).
    with pytest.raises(SqlError, match=named):
        plan(sql, driver_fallback_bytes=-1)


@pytest.mark.parametrize("shared", [True, False])
def test_what_cannot_be_distributed_runs_on_the_driver_over_whole_tables(plan, shared):
    sql = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 3) SELECT * FROM r, ua"
    p = plan(sql, shared_storage=shared)
    assert [type(s.root).__name__ for s in p.stages][-1] == "DriverQuery"
    assert p.stages[-1].on_driver
    gathers = [s.output.kind for s in p.stages if s.output is not None]
    # Shared storage: the driver reads every partition itself; otherwise the ranks gather to it.
    assert gathers == ([] if shared else ["gather"])
    with pytest.raises(SqlError, match=r"RECURSIVE.*over the 0 MB limit"):
        plan(sql, driver_fallback_bytes=0)


def test_a_refusal_names_its_construct_and_a_driver_plan_says_why(plan):
    sql = "SELECT ua.k FROM ua POSITIONAL JOIN ub"
    with pytest.raises(NotDistributed) as info:
        plan(sql, driver_fallback_bytes=-1)
    assert info.value.construct == "POSITIONAL JOIN"
    p = plan(sql)
    assert p.on_driver == OnDriver("POSITIONAL JOIN", "POSITIONAL JOIN")
    assert "DriverQuery: the whole query on the driver, not distributed: POSITIONAL JOIN" in explain_plan(p)
    assert plan("SELECT k FROM ua").on_driver is None
    # The name leaves out the query's own names, so that refusals can be counted by it.
    with pytest.raises(NotDistributed, match=r"USING \(k\) on columns of different types") as info:
        plan("SELECT * FROM hi JOIN hk USING (k)", driver_fallback_bytes=-1)
    assert info.value.construct == "JOIN ... USING on columns of different types"


def test_a_bug_in_the_planner_is_an_internal_error_never_a_fallback(plan, monkeypatch):
    def broken(self, tree, prefix):
        raise KeyError("no such column")

    # The fallback is on and the tables small: a refusal would run on the driver.
    monkeypatch.setattr(builder.Builder, "query", broken)
    with pytest.raises(InternalError) as info:
        plan("SELECT k FROM ua")
    message = str(info.value)
    assert message.startswith(
        "internal error in the planner (a bug in duckflock): KeyError: 'no such column'"
    )
    assert "test_planner.py" in message and message.endswith("Query: SELECT k FROM ua")
    assert not isinstance(info.value, SqlError)


def test_asof_lateral_and_distinct_on_are_distributed(plan):
    asof = plan(
        "SELECT ua.k, ub.w FROM ua ASOF JOIN ub ON ua.k = ub.k AND ua.v >= ub.w", driver_fallback_bytes=-1
    )
    (join,) = nodes(asof, Join)
    assert join.kind == "asof" and join.strategy in (
        "co-located",
        "shuffle right",
        "shuffle left",
        "shuffle both",
        "broadcast right",
    )
    lateral = plan(
        "SELECT ua.k, l.w FROM ua, LATERAL (SELECT ub.w FROM ub WHERE ub.k = ua.k LIMIT 1) l",
        driver_fallback_bytes=-1,
    )
    (join,) = [j for j in nodes(lateral, Join) if j.lateral]
    assert join.strategy == "lateral over replicated inputs"
    don = plan("SELECT DISTINCT ON (k) k, v FROM ua ORDER BY k, v", driver_fallback_bytes=-1)
    assert nodes(don, Window)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT k, count(*) FROM ua GROUP BY ROLLUP (k)",
        "SELECT k, count(*) FROM ua GROUP BY CUBE (k)",
        "SELECT k, count(*) FROM ua GROUP BY GROUPING SETS ((k), ())",
    ],
)
def test_grouping_sets_combine_per_rank_partials_on_the_driver(plan, sql):
    p = plan(sql)
    aggs = nodes(p, Aggregate)
    assert sorted(a.phase for a in aggs) == ["final", "partial"]
    final = next(a for a in aggs if a.phase == "final")
    assert final.grouping_sets is not None and () in final.grouping_sets
    assert p.stages[-1].on_driver


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        ("SELECT * FROM nope", "nope"),
        ("SELECT ua.k FROM ua JOIN missing_table m ON ua.k = m.k", "missing_table"),
        ("SELECT nocol FROM ua", "nocol"),
        ("SELECT ua.k FROM ua JOIN ub ON ua.k = ub.not_there", "not_there"),
    ],
)
def test_missing_tables_and_columns_are_named(plan, sql, named):
    with pytest.raises((CatalogError, SqlError), match=named):
        plan(sql)


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ("INSERT INTO ua VALUES (1, 2)", "INSERT"),
        ("CREATE TABLE x (a INTEGER)", "CREATE"),
        ("CREATE TABLE x AS SELECT * FROM ua", "CREATE"),
        ("DELETE FROM ua", "DELETE"),
        ("UPDATE ua SET v = 1", "UPDATE"),
        ("DROP TABLE ua", "DROP"),
    ],
)
def test_statements_other_than_select_are_refused(plan, sql, kind):
    with pytest.raises(SqlError, match=f"only SELECT.*{kind}"):
        plan(sql)


@pytest.mark.parametrize("sql", ["", "   ;", "SELECT 1; SELECT 2", "SELEC 1"])
def test_malformed_input_is_a_sql_error(plan, sql):
    with pytest.raises(DuckflockError):
        plan(sql)


@pytest.mark.parametrize(
    "sql", ["SELECT 1 * FROM ua", "SELECT (k FROM ua", "SELECT k FROM ua WHERE", "SELECT k FROM ua LIMIT"]
)
def test_a_syntax_error_is_told_in_duckdbs_words(plan, sql):
    # Not sqlglot's ("Required keyword: 'expression' missing for <class ...Mul>", "Expecting )").
    with pytest.raises(duckdb.ParserException) as duckdbs:
        duckdb.connect().extract_statements(sql)
    with pytest.raises(SqlError) as ours:
        plan(sql)
    assert str(ours.value) == str(duckdbs.value)
    assert str(ours.value).startswith("Parser Error: syntax error at or near")


def test_sql_only_duckdb_parses_is_refused_naming_where_sqlglot_stopped(plan):
    sql = "SELECT k IS NULL, count(*) FROM ua GROUP BY ROLLUP (k IS NULL)"
    with pytest.raises(SqlError) as refused:
        plan(sql, driver_fallback_bytes=-1)
    message = str(refused.value)
    assert 'sqlglot, cannot read it at "IS", line 1' in message
    assert "Expecting" not in message and "<class" not in message


# ---- range shuffle into a narrower key type ---------------------------------------------------------


def test_range_shuffle_from_a_wider_key_type_computes_targets(plan, catalog):
    p = plan("SELECT count(*) FROM rint JOIN bigv ON rint.k = bigv.k", broadcast_threshold_bytes=0)
    j = the_join(p)
    spec, _ = _moved_and_kept(p, j)
    assert spec.kind == "range"
    values = [5, 2999, 3_000_000_000]
    rel = f"SELECT k AS {spec.keys[0]} FROM (VALUES {', '.join(f'({v}::BIGINT)' for v in values)}) v(k)"
    got = duckdb.sql(f"SELECT {target_sql(spec.keys, spec.target, 4)} FROM ({rel})").fetchall()
    # Keys that exist in rint go where rint keeps them; others may go anywhere.
    parts = catalog.table("rint").partitions
    owner = [next(i for i, q in enumerate(parts) if q.min <= v <= q.max) for v in values[:2]]
    assert [g[0] for g in got[:2]] == owner


def test_hash_partitioning_from_another_duckdb_hash_is_not_trusted(tmp_path):
    """A table whose recorded hash canary differs from this DuckDB's (written by a DuckDB whose
    hash() differs) is shuffled, not joined co-located, and the answer stays DuckDB's."""
    import json
    import warnings

    import duckflock
    from support import assert_same, oracle

    make_table(tmp_path, "l", "SELECT i % 50 AS k, i AS v FROM range(400) t(i)", 4, "hash", ("k",))
    make_table(tmp_path, "r", "SELECT i AS k, 'r' || i AS w FROM range(60) t(i)", 4, "hash", ("k",))
    sql = "SELECT l.k, l.v, r.w FROM l JOIN r ON l.k = r.k"

    def strategy() -> str:
        catalog = Catalog.load(tmp_path)
        p = plan_query(sql, catalog, SchemaDB(catalog), 2, Config(broadcast_threshold_bytes=0))
        return next(n for s in p.stages for n in walk(s.root) if isinstance(n, Join)).strategy

    assert strategy() == "co-located"
    path = tmp_path / "duckflock_catalog.json"
    data = json.loads(path.read_text())
    data["tables"]["r"]["partitioning"]["hash_canary"] += 1  # as if another DuckDB had placed r
    data["tables"]["r"]["partitioning"]["duckdb"] = "0.0.1"
    path.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="0.0.1.*treated as unpartitioned"):
        assert strategy() != "co-located"
    with (
        warnings.catch_warnings(),
        duckflock.connect(
            str(tmp_path), ranks=2, transport="threads", config={"broadcast_threshold_bytes": 0}
        ) as db,
    ):
        warnings.simplefilter("ignore")
        assert_same(db.sql(sql).arrow(), oracle(tmp_path).sql(sql).to_arrow_table())


def test_errors_do_not_suggest_duckdb_internal_tables(plan):
    with pytest.raises(DuckflockError) as e:
        plan("SELECT * FROM pg_tabls")
    assert "pg_" not in str(e.value).replace("pg_tabls", ""), str(e.value)


def test_aggregate_names_follow_duckdbs_catalog_through_macros():
    """Aggregates by DuckDB's catalog: its aggregates and the macros calling one, also through
    another macro (geomean is exp(avg(ln(x)))); not scalar functions nor scalar macros."""
    from duckflock.sql.functions import AggregateNames, function_rows

    con = duckdb.connect()
    con.execute("CREATE MACRO twice_total(x) AS 2 * sum(x)")
    con.execute("CREATE MACRO via_macro(x) AS twice_total(x) + 1")
    con.execute("CREATE MACRO plain(x) AS x + 1")
    # Macros calling each other in a cycle, one of them aggregating: both aggregate.
    con.execute("CREATE MACRO cycle_b(x) AS x")
    con.execute("CREATE MACRO cycle_a(x) AS cycle_b(x) + sum(x)")
    con.execute("CREATE OR REPLACE MACRO cycle_b(x) AS cycle_a(x)")
    for order in (["cycle_b", "cycle_a"], ["cycle_a", "cycle_b"]):
        names = AggregateNames(function_rows(con))
        assert [n in names for n in order] == [True, True]
    names = AggregateNames(function_rows(con))
    for name in ("sum", "mad", "list", "geomean", "twice_total", "via_macro"):
        assert name in names, name
    for name in ("abs", "pg_typeof", "plain", "no_such_function", None):
        assert name not in names, name


def test_approx_top_k_is_planned_without_sqlglots_warning(plan, caplog):
    """sqlglot warns that APPROX_TOP_K cannot be transpiled (to other dialects' types); from DuckDB
    to DuckDB it is written as read, so duckflock says nothing; other warnings still show."""
    with caplog.at_level(logging.WARNING, logger="sqlglot"):
        plan("SELECT n, approx_top_k(s, 2) AS top FROM words GROUP BY n")
        logging.getLogger("sqlglot").warning("another warning")
    assert [r.getMessage() for r in caplog.records] == ["another warning"]


@pytest.mark.parametrize(
    "sql",
    [
        # In an outer join's condition: computed on the side it reads, below a co-located join.
        "SELECT a.v, b.v FROM hk a LEFT JOIN hk b ON a.k = b.k AND b.v IN (SELECT k FROM tiny)",
        "SELECT a.v, b.v FROM hk a FULL JOIN hk b ON a.k = b.k AND EXISTS (SELECT 1 FROM tiny WHERE tiny.k = a.v)",
        # In an aggregate's FILTER and as a group key: computed per row below the aggregate.
        "SELECT count(*) FILTER (WHERE v IN (SELECT k FROM tiny)) FROM hk",
        "SELECT v IN (SELECT k FROM tiny) AS i, count(*) FROM hk GROUP BY 1",
    ],
)
def test_a_subquery_inside_a_join_condition_or_an_aggregate_runs_distributed(plan, sql):
    p = plan(sql, driver_fallback_bytes=-1, broadcast_threshold_bytes=0)
    assert p.on_driver is None
    for n in nodes(p, Join):
        assert n.strategy == "co-located" and "__sq" not in (n.condition or "")
    assert not any(s.replicated for s in nodes(p, Scan) if s.table == "hk")


def test_a_subquery_reading_both_sides_of_an_outer_join_condition_is_refused(plan):
    sql = "SELECT a.v FROM hk a LEFT JOIN hk b ON a.k = b.k AND a.v + b.v IN (SELECT k FROM tiny)"
    with pytest.raises(NotDistributed) as info:
        plan(sql, driver_fallback_bytes=-1)
    assert info.value.construct == "a subquery reading both sides of an outer, semi or anti join's condition"


def test_a_view_read_twice_is_computed_once(plan):
    """TPC-H Q15's shape: the grouped view in FROM and in a scalar subquery runs as one stage, whose
    exchange two stages read (plan/shared_stages.py); distributed results: tests/sql/shared_stages.test."""
    p = plan(
        "WITH r AS (SELECT v, sum(k) AS total FROM hk GROUP BY v) "
        "SELECT r.v, r.total FROM r WHERE r.total = (SELECT max(total) FROM r)"
    )
    scans = [s for s in p.stages if any(isinstance(n, Scan) for n in walk(s.root))]
    assert len(scans) == 1
    [shared] = [s.output for s in p.stages if s.output is not None and s.output.shared]
    assert sum(shared.xid in s.inputs for s in p.stages) == 2


def test_volatile_rows_are_not_shared(plan):
    """Two reads of a view calling random() each compute their own rows, as DuckDB's copies do."""
    sub = "(SELECT v, sum(k) AS t FROM hk WHERE random() < 0.5 GROUP BY v)"
    p = plan(f"SELECT count(*) FROM {sub} a JOIN {sub} b ON a.v = b.v")
    assert p.on_driver is None
    assert not any(s.output is not None and s.output.shared for s in p.stages)
    assert len([s for s in p.stages if any(isinstance(n, Scan) for n in walk(s.root))]) == 2
