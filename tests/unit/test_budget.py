"""The node's memory limit is read from the rank's own cgroup path (v1 and v2) and SLURM, and split;
DuckDB and glibc hand memory back."""

from __future__ import annotations

import re
import subprocess
import sys

import duckdb
import pytest

from duckflock.config import Config
from duckflock.exchange.shuffle import split_bytes
from duckflock.exec.resources import budget
from duckflock.local_duckdb import open_duckdb


def test_cgroup_v2_limit_on_own_path_and_parents(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/jobs/job7/step0\n")
    root = tmp_path / "fs"
    (root / "jobs/job7/step0").mkdir(parents=True)
    (root / "jobs/job7/step0/memory.max").write_text("max\n")
    (root / "jobs/job7/memory.max").write_text(str(3 << 30))
    (root / "memory.max").write_text("max\n")
    assert budget._cgroup_limits(str(proc), str(root)) == [3 << 30]


def test_cgroup_v1_memory_controller(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("5:cpu,cpuacct:/x\n4:memory:/slurm/uid_0/job_1\n")
    root = tmp_path / "fs"
    (root / "memory/slurm/uid_0/job_1").mkdir(parents=True)
    (root / "memory/slurm/uid_0/job_1/memory.limit_in_bytes").write_text(str(1536 << 20))
    (root / "memory/memory.limit_in_bytes").write_text("9223372036854771712")  # v1's "no limit"
    assert budget._cgroup_limits(str(proc), str(root)) == [1536 << 20]


def test_slurm_allocation_and_split(monkeypatch):
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "2048")
    assert budget.node_memory_bytes() <= 2048 << 20
    b = budget.Budget.of_rank(Config(memory_limit_bytes=1000 << 20), ranks_on_node=2, ranks=2)
    assert b.rank_bytes == 1000 << 20
    assert b.duckdb_bytes + b.exchange_bytes + b.inflight_bytes < b.rank_bytes
    assert budget.Budget.of_rank(Config(exchange_memory_bytes=7), 2, 2).exchange_bytes == 7


@pytest.mark.parametrize(
    ("rank_mib", "ranks", "batch_rows", "at_once", "chunk_mib"),
    [
        (128, 2, 65536, 1, 1),
        (307, 4, 65536, 3, 1),  # 4 ranks in a 1.5 GiB node: chunks shrink, a streamed join fits
        (614, 2, 65536, 4, 4),
        (614, 2, 262144, 2, 4),  # larger batches, fewer stages
        (2048, 64, 65536, 4, 1),  # many targets: more chunks waiting per stage
        (16384, 4, 65536, 8, 2),  # plenty of room: chunks of SPLIT_BYTES / targets
        (16384, 64, 65536, 8, 1),  # ... but 1 MiB at least
    ],
)
def test_stages_at_once_fit_what_duckdb_and_exchanges_leave(
    rank_mib, ranks, batch_rows, at_once, chunk_mib, monkeypatch
):
    """Streaming runs several stages at once only where each one's batch, the batches it splits
    together and the chunks it holds for every target fit (exec/resources/budget.py); chunks (4 MiB configured) shrink where that room is tight
    or where there are many targets."""
    monkeypatch.setattr(budget, "own_anon_bytes", lambda: 100 << 20)
    config = Config(memory_limit_bytes=rank_mib << 20, batch_rows=batch_rows, chunk_bytes=4 << 20)
    got = budget.Budget.of_rank(config, 1, ranks)
    assert (got.stages_at_once, got.chunk_bytes >> 20) == (at_once, chunk_mib)
    room = int((got.rank_bytes - (100 << 20)) * budget.REST_PART)
    unsplit = split_bytes(got.chunk_bytes, ranks)
    stage = budget.BATCH_BYTES_PER_ROW * batch_rows + unsplit + ranks * got.chunk_bytes
    assert got.stages_at_once == 1 or got.stages_at_once * stage <= room


def test_broadcast_bound_is_a_share_of_duckdbs_part_of_the_rank(monkeypatch):
    """Derived from the node's limit only (not from what the process holds), so ``explain`` and the
    ranks derive the same plan; an explicit bound is kept."""
    monkeypatch.setattr(budget, "node_memory_bytes", lambda: 10 << 30)
    derived = budget.with_derived_limits(Config(), ranks_on_node=2).broadcast_max_bytes
    assert derived == int(int((10 << 30) * 0.8 / 2) * budget.DUCKDB_PART) // budget.BROADCAST_SHARE
    limited = budget.with_derived_limits(Config(memory_limit_bytes=400 << 20), ranks_on_node=2)
    assert limited.broadcast_max_bytes == int((400 << 20) * budget.DUCKDB_PART) // budget.BROADCAST_SHARE
    assert budget.with_derived_limits(Config(broadcast_max_bytes=-1), 2).broadcast_max_bytes == -1


@pytest.mark.parametrize(
    ("node_gib", "available_gib", "exchange_mib"),
    [
        (24, 24, 973),  # nothing else runs: the exchange part of the rank's share less what it holds
        (24, 4, 163),  # other processes hold most of the node: its part of what is available
        (1.5, 20, 51),  # a cgroup limit below what the host has available: the limit
    ],
)
def test_received_data_budget_follows_the_nodes_real_memory(
    node_gib, available_gib, exchange_mib, monkeypatch
):
    """Received exchange data stays in memory up to the rank's part of the node's limit and of the
    memory available now, divided among the node's ranks (2 here), DuckDB's part left to it."""
    monkeypatch.setattr(budget, "own_anon_bytes", lambda: 100 << 20)
    monkeypatch.setattr(budget, "node_memory_bytes", lambda: int(node_gib * (1 << 30)))
    monkeypatch.setattr(budget, "available_bytes", lambda: int(available_gib * (1 << 30)))
    got = budget.Budget.of_rank(Config(), ranks_on_node=2, ranks=2)
    assert got.exchange_bytes >> 20 == exchange_mib
    assert got.duckdb_bytes + got.exchange_bytes < got.rank_bytes


def test_available_memory_is_read_from_the_kernel():
    assert (
        0 < budget.available_bytes() <= budget.os.sysconf("SC_PAGE_SIZE") * budget.os.sysconf("SC_PHYS_PAGES")
    )


def test_each_duckdb_hands_memory_back_at_its_ranks_share_of_duckdbs_thresholds():
    """One rank on the node keeps DuckDB's own allocator thresholds; 4 ranks each a quarter."""

    def thresholds(con: duckdb.DuckDBPyConnection) -> list[int]:
        got = []
        for name in ("allocator_flush_threshold", "allocator_bulk_deallocation_flush_threshold"):
            number, unit = re.fullmatch(
                r"([\d.]+) ?(B|KiB|MiB|GiB)", con.execute(f"SELECT current_setting('{name}')").fetchone()[0]
            ).groups()
            got.append(int(float(number) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]))
        return got

    with (
        duckdb.connect() as plain,
        open_duckdb(1, 64 << 20) as one,
        open_duckdb(1, 64 << 20, ranks_on_node=4) as four,
    ):
        assert thresholds(one) == thresholds(plain)
        assert thresholds(four) == [t // 4 for t in thresholds(plain)]


def test_large_buffers_stay_mapped_after_one_is_freed():
    """glibc would serve the second 8 MiB request from its heap, having raised its mmap threshold
    when the first was freed; with it fixed both get a mapping of their own, returned when freed.
    In a fresh process: in this one the heap may hold a free chunk that large, served first."""
    script = """
import ctypes, sys
from duckflock.exec.resources import memory
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "fixed":
    memory.map_large_buffers()
libc.free(libc.malloc(8 << 20))
mapped = memory._mallinfo2().hblks
second = libc.malloc(8 << 20)
print(memory._mallinfo2().hblks - mapped)
"""

    def mapped(how: str) -> str:
        return subprocess.run(
            [sys.executable, "-c", script, how], capture_output=True, text=True, check=True
        ).stdout.strip()

    assert (mapped("dynamic"), mapped("fixed")) == ("0", "1")
