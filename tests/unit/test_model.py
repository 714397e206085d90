"""The performance model's projection rules (benchmarks/duckflock_bench/model.py), on made-up counts:
a shuffle's per-pair messages shrink with N², a broadcast's bytes per node do not, a replicated
input past the broadcast threshold is hashed instead, the driver's final stage does not shrink."""

from __future__ import annotations

import math

import pytest

from duckflock_bench.model import CHUNK_BYTES, Constants, Counts, predict_stage, project

K = Constants(
    scan_values_s=1e8,
    scan_string_gbps=1.0,
    join_rows_s=2e7,
    agg_rows_s=1e7,
    sort_rows_s=5e6,
    arrow_gbps=1.0,
    ipc_gbps=5.0,
    partition4_gbps=1.0,
    partition64_gbps=0.5,
    net_gbps=12.5,
    latency_s=1e-5,
    overhead_s=0.001,
    overhead_per_stage_s=0.001,
    overhead_per_rank_s=0.0001,
)


def two_ranks(sid: int, kind: str, final: bool = False, **counts: float) -> list[Counts]:
    return (
        [Counts(sid, r, final, kind, **counts) for r in range(2)]
        if not final
        else [Counts(sid, 0, True, "", **counts)]
    )


def test_a_shuffles_pairs_shrink_with_n_squared_and_latency_takes_over():
    counts = [
        *two_ranks(0, "hash", scan_values=1e7, bytes_out=1e9),
        *two_ranks(1, "", final=True, rows_out=10),
    ]
    small, large = project(counts, K, 1.0, 16, 32, 2), project(counts, K, 1.0, 1024, 32, 2)
    assert small.pair_bytes == pytest.approx(2e9 / 16 * 15 / 16 / 15)
    assert large.pair_bytes == pytest.approx(small.pair_bytes * (16 / 1024) ** 2)
    # At 1,024 nodes the 1,023 messages' latency outweighs the bytes each node sends.
    assert 1023 * K.latency_s > 2e9 / 1024 / (K.net_gbps * 1e9)
    assert large.phases["network"] > 1023 * K.latency_s
    assert large.phases["scan"] == pytest.approx(small.phases["scan"] * 16 / 1024)


def test_a_broadcast_is_as_large_per_node_at_any_n_until_hashed_past_the_threshold():
    counts = [*two_ranks(0, "broadcast", bytes_out=1e5), *two_ranks(1, "", final=True)]
    sizes = [project(counts, K, 1.0, n, 32, 2).broadcast_bytes for n in (16, 256)]
    assert sizes[0] == pytest.approx(2e5 * 15 / 16) and sizes[1] == pytest.approx(2e5 * 255 / 256)
    assert project(counts, K, 1000.0, 16, 32, 2).broadcast_bytes == 0  # 200 MB: hashed instead


def test_a_replicated_table_past_the_threshold_is_split_and_shuffled():
    counts = [*two_ranks(0, "gather", scan_whole_values=1e6, join_whole=1e6), *two_ranks(1, "", final=True)]
    small = project(counts, K, 1.0, 64, 32, 2)  # 8 MB whole on every node: replicated
    large = project(counts, K, 100.0, 64, 32, 2)  # 800 MB: hashed
    assert small.replanned == [] and large.replanned == [0]
    assert small.phases["operators"] == pytest.approx(1e6 / K.join_rows_s / 32, rel=0.01)
    assert large.phases["operators"] == pytest.approx(100 * 1e6 / K.join_rows_s / 32 / 64, rel=0.01)
    assert large.phases["network"] > 0


def test_the_drivers_final_stage_does_not_shrink_with_n():
    counts = [
        *two_ranks(0, "gather", rows_out=1e6, bytes_out=1e8),
        *two_ranks(1, "", final=True, sort_rows=2e6),
    ]
    finals = [project(counts, K, 1.0, n, 32, 2).phases["final"] for n in (16, 1024)]
    assert finals[1] >= finals[0] > 2e6 / K.sort_rows_s / 32


def test_predict_stage_phases():
    c = Counts(0, 0, False, "hash", scan_values=1e8, join_rows=2e7, bytes_out=1e9, bytes_wire=5e8, targets=1)
    p = predict_stage(c, K, 2.0)
    assert p["scan"] == pytest.approx(0.5)
    assert p["operators"] == pytest.approx((1.0 + 1.0) / 2)  # joins, then Arrow output
    assert p["partition"] == pytest.approx(1.0 + 0.1)
    assert p["network"] == pytest.approx(0.04 + math.ceil(5e8 / CHUNK_BYTES) * K.latency_s)  # 4 MiB messages
