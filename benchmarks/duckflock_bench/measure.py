"""Small measurements shared by the benchmarks: memcpy bandwidth, peak memory, machine facts."""

from __future__ import annotations

import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

GB = 1e9
T = TypeVar("T")


def cores() -> int:
    """Cores this process may use (what duckflock's runtime divides among the ranks of a node)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def memcpy_gbps(nbytes: int = 512 << 20, repeats: int = 5) -> float:
    """Median GB/s of copying an ``nbytes`` array into another (pages touched before timing)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / GB


def _status_kb(field: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{field}:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(m.group(1)) if m else None


def peak_rss_kb() -> int:
    """This process's peak resident set size in KiB (VmHWM; ru_maxrss where /proc is missing)."""
    hwm = _status_kb("VmHWM")
    if hwm is not None:
        return hwm
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def file_rss_kb() -> int:
    """Resident pages of this process backed by files (shared libraries, mostly), in KiB."""
    return _status_kb("RssFile") or 0


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs). False if refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine_info(memcpy: bool = True) -> dict[str, object]:
    """Facts about this machine; with ``memcpy``, also its memcpy GB/s measured now."""
    info: dict[str, object] = {
        "hostname": platform.node(),
        "cpu": cpu_model(),
        "cores": cores(),
        "cpu_count": os.cpu_count(),
        "memory_gb": round(memory_bytes() / GB, 1),
        "python": platform.python_version(),
        "load_average_at_start": load_average(),
    }
    if memcpy:
        info["memcpy_gbps"] = round(memcpy_gbps(), 3)
    return info


def versions(with_mpi: bool = True) -> dict[str, str]:
    """Library versions; MPI's only when asked (importing mpi4py.MPI initializes MPI)."""
    import duckdb
    import pyarrow

    out = {"duckdb": duckdb.__version__, "pyarrow": pyarrow.__version__, "numpy": np.__version__}
    import mpi4py

    out["mpi4py"] = mpi4py.__version__
    if with_mpi:
        from mpi4py import MPI

        out["mpi"] = " ".join(MPI.Get_library_version().split("\n")[0].split())
    return out


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """``fn()``'s wall time in seconds and its value."""
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def parse_list(text: str, kind: type) -> list:
    """``"0.1,0.5,1"`` -> [0.1, 0.5, 1.0] (kind float) or ``"1,2,4"`` -> [1, 2, 4] (kind int)."""
    return [kind(x) for x in str(text).split(",") if x.strip()]
