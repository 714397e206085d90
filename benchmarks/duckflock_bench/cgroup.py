"""A node of a given memory size, modelled as a memory cgroup (root only; cgroup v2 or v1).

A command runs inside a fresh cgroup; a sampler thread reads, every 50 ms, the cgroup's anonymous
memory (what the processes hold, not the page cache of files they read, which the kernel reclaims)
and the size of a spill directory. The OOM killer's kills are read from the cgroup's counters.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_V2 = Path("/sys/fs/cgroup")
_V1 = Path("/sys/fs/cgroup/memory")
_names = itertools.count()


def available() -> str | None:
    """Why memory cgroups cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root to create a memory cgroup"
    if (_V2 / "cgroup.controllers").exists():
        if "memory" not in (_V2 / "cgroup.controllers").read_text().split():
            return "the cgroup v2 hierarchy has no memory controller"
        return None
    if (_V1 / "memory.limit_in_bytes").exists():
        return None
    return "no memory cgroup hierarchy is mounted"


@dataclass
class Measured:
    seconds: float
    returncode: int
    peak_anon_bytes: int
    peak_spill_bytes: int
    oom_kills: int
    stdout: str
    stderr: str


def run_in_cgroup(
    cmd: list[str], limit_bytes: int | None, spill_dir: Path, env: dict[str, str], timeout: float
) -> Measured:
    """Run ``cmd`` in a new memory cgroup limited to ``limit_bytes`` (None: no limit, measured only)."""
    v2 = (_V2 / "cgroup.controllers").exists()
    group = (_V2 if v2 else _V1) / f"duckflock-bench-{os.getpid()}-{next(_names)}"
    group.mkdir()
    try:
        if limit_bytes is not None:
            (group / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit_bytes))
            if v2:
                (group / "memory.swap.max").write_text("0")
        # The shell moves itself into the cgroup, then becomes the command: no process escapes it.
        wrapped = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *cmd]
        peaks = {"anon": 0, "spill": 0}
        done = threading.Event()
        sampler = threading.Thread(target=_sample, args=(group, v2, spill_dir, peaks, done), daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(wrapped, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            _kill_all(group)
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            proc = subprocess.CompletedProcess(wrapped, -9, out, f"timed out after {timeout:.0f} s")
        seconds = time.perf_counter() - t0
        done.set()
        sampler.join()
        return Measured(
            seconds,
            proc.returncode,
            peaks["anon"],
            peaks["spill"],
            _oom_kills(group, v2),
            proc.stdout,
            proc.stderr,
        )
    finally:
        _remove(group)


def _sample(group: Path, v2: bool, spill_dir: Path, peaks: dict[str, int], done: threading.Event) -> None:
    while not done.wait(0.05):
        peaks["anon"] = max(peaks["anon"], _anon_bytes(group, v2))
        peaks["spill"] = max(peaks["spill"], _dir_bytes(spill_dir))


def _stat(group: Path) -> dict[str, int]:
    try:
        pairs = (line.split() for line in (group / "memory.stat").read_text().splitlines())
        return {k: int(v) for k, v in pairs}
    except (OSError, ValueError):
        return {}


def _anon_bytes(group: Path, v2: bool) -> int:
    stat = _stat(group)
    if v2:
        return stat.get("anon", 0) + stat.get("shmem", 0)
    return stat.get("total_rss", stat.get("rss", 0)) + stat.get("total_shmem", stat.get("shmem", 0))


def _oom_kills(group: Path, v2: bool) -> int:
    name = "memory.events" if v2 else "memory.oom_control"
    try:
        for line in (group / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):  # a spill file removed while we look
                total += os.stat(os.path.join(root, f)).st_blocks * 512
    return total


def _kill_all(group: Path) -> None:
    """Every process left in the cgroup (ranks of a job whose launcher timed out)."""
    with contextlib.suppress(OSError):
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)


def _remove(group: Path) -> None:
    _kill_all(group)
    for _ in range(100):  # the cgroup is removable once its last process has gone
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.05)
