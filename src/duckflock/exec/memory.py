"""Keeping what glibc malloc holds freed but resident small, during and after a stage.

DuckDB and numpy allocate through glibc malloc, whose freed chunks mostly sit inside the heap where
they are not trimmed from its top; they stay resident, so the next stage's peak sits on top of the
last one's. Trimming costs time too: the next stage faults the pages in again (slow on VMs). So we
trim only when a stage left a lot of free heap behind. Measured on the seed query at SF 5 with
2 ranks: the sum of the ranks' peak RSS falls from 2.0x to 1.7x single-process DuckDB's.

During a stage, large buffers (DuckDB's Arrow batches, blocks) are allocated by one thread and
freed by another. glibc maps a large allocation on its own (returned to the system when freed), but
raises that threshold to the size of each such buffer freed, up to 32 MiB: soon every batch lands
in a heap, where the freed ones stay as fragments. A fixed threshold keeps them mapped (glibc's own
tuning variable, MALLOC_MMAP_THRESHOLD_, would have to be set before the process starts).
"""

from __future__ import annotations

import ctypes

import pyarrow as pa

from duckflock.errors import DuckflockError

# Trim when at least this much freed memory sits in malloc's heap.
TRIM_THRESHOLD_BYTES = 64 << 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def _glibc():
    try:
        libc = ctypes.CDLL(None)  # this process's symbols, libc's included (no ldconfig lookup)
        trim, info, opt = libc.malloc_trim, libc.mallinfo2, libc.mallopt
    except (OSError, AttributeError):  # not glibc (2.33+): nothing to trim
        return None, None, None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    info.argtypes, info.restype = [], _MallInfo2
    opt.argtypes, opt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return trim, info, opt


_malloc_trim, _mallinfo2, _mallopt = _glibc()


def fix_mmap_threshold(threshold_bytes: int) -> None:
    """Map every allocation of at least ``threshold_bytes`` on its own, for good (0: leave glibc's
    moving threshold; process-wide)."""
    if threshold_bytes > 0 and _mallopt is not None and not _mallopt(_M_MMAP_THRESHOLD, threshold_bytes):
        raise DuckflockError(f"glibc refused an mmap threshold of {threshold_bytes} bytes")


def release_free_memory() -> None:
    pa.default_memory_pool().release_unused()
    if _malloc_trim is not None and _mallinfo2().fordblks >= TRIM_THRESHOLD_BYTES:
        _malloc_trim(0)
