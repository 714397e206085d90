"""Peak memory of a process tree without a cgroup: the summed proportional set size (Pss).

A sampler thread walks, every 20 ms, the command's process tree and adds up each process's
``Pss`` from ``/proc/<pid>/smaps_rollup``. Pss divides every shared page among the processes that
map it, so the sum counts a page the ranks share (the shared libraries of Python, DuckDB, Arrow and
MPI; shared memory) once, as one node holds it, and each private page once. Page cache of files
read with ``read()`` (Parquet) is in no process's Pss, as in the cgroup's anonymous count; pages of
memory-mapped files (spilled exchange data) are, while resident. The peak is of the sum at one
instant, not a sum of each process's own peak. Needs no privileges: only the caller's processes.

Per process the peak is also kept, grouped by role (``rank`` for the processes that load DuckDB,
``other`` for launchers and guards), so that what the ranks hold is reported apart from mpiexec.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from duckflock_bench.cgroup import _dir_bytes

_PERIOD_S = 0.02


@dataclass
class Sampled:
    seconds: float
    returncode: int
    peak_pss_bytes: int  # the whole tree, at its peak instant
    peak_rank_pss_bytes: int  # the processes that loaded DuckDB, at their peak instant
    peak_spill_bytes: int
    stdout: str
    stderr: str
    peak_by_pid: dict[int, int] = field(default_factory=dict)  # each rank process's own peak Pss


def available() -> str | None:
    """Why Pss cannot be sampled here, or None when it can."""
    if not Path("/proc/self/smaps_rollup").exists():
        return "needs /proc/<pid>/smaps_rollup (Linux 4.14+)"
    return None


def run_sampled(cmd: list[str], spill_dir: Path, env: dict[str, str], timeout: float) -> Sampled:
    """Run ``cmd`` and sample its process tree's summed Pss until it exits."""
    peaks = {"tree": 0, "ranks": 0, "spill": 0}
    by_pid: dict[int, int] = {}
    done = threading.Event()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    args = (proc.pid, spill_dir, peaks, by_pid, done)
    sampler = threading.Thread(target=_sample, args=args, daemon=True)
    sampler.start()
    try:
        out, errs = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        for pid in _tree(proc.pid):
            _kill(pid)
        out, errs = proc.communicate()
        code, errs = -9, f"timed out after {timeout:.0f} s"
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    return Sampled(seconds, code, peaks["tree"], peaks["ranks"], peaks["spill"], out, errs, by_pid)


def _sample(
    root: int, spill_dir: Path, peaks: dict[str, int], by_pid: dict[int, int], done: threading.Event
) -> None:
    ranks_seen: set[int] = set()
    while not done.wait(_PERIOD_S):
        tree = ranks = 0
        for pid in _tree(root):
            pss = _pss_bytes(pid)
            tree += pss
            if _is_rank(pid, ranks_seen):
                ranks += pss
                by_pid[pid] = max(by_pid.get(pid, 0), pss)
        peaks["tree"] = max(peaks["tree"], tree)
        peaks["ranks"] = max(peaks["ranks"], ranks)
        peaks["spill"] = max(peaks["spill"], _dir_bytes(spill_dir))


def _tree(root: int) -> Iterator[int]:
    """``root`` and every descendant (children read from /proc/<pid>/task/*/children)."""
    todo = [root]
    while todo:
        pid = todo.pop()
        yield pid
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                todo += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:  # the process ended while we looked
            continue


def _pss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _is_rank(pid: int, seen: set[int]) -> bool:
    """Whether the process has DuckDB loaded: a rank (or the DuckDB baseline), not a launcher."""
    if pid in seen:  # a process that has loaded DuckDB keeps it; one that has not yet may still
        return True
    try:
        found = "duckdb" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False
    if found:
        seen.add(pid)
    return found


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 9)
