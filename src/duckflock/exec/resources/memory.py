"""Handing the memory that stages free back to the operating system.

DuckDB and numpy allocate through glibc malloc, whose freed chunks mostly sit inside the heap where
they are not trimmed from its top; they stay resident, so the next stage's peak sits on top of the
last one's. Trimming costs time too: the next stage faults the pages in again (slow on VMs). So we
trim only when a stage left a lot of free heap behind, which lowers the ranks' summed peak where
stages follow one another.

Large buffers are another matter. glibc serves a request of at least its mmap threshold (128 KiB at
first) with a mapping of its own, unmapped when freed, but raises the threshold to the size of each
such chunk freed, up to 32 MiB. The exchanges' buffers (DuckDB's Arrow batches, the rows gathered
per target) are up to a few MB each and freed within moments, so after the first few they come from
the heap, where the freed ones stay resident around those still held. A fixed threshold keeps them
mapped, and each is returned to the system when freed; DuckDB allocates its own memory through
jemalloc and is not affected.
"""

from __future__ import annotations

import ctypes

import pyarrow as pa

# Trim when at least this much freed memory sits in malloc's heap.
TRIM_THRESHOLD_BYTES = 64 << 20
# Requests of at least this size get a mapping of their own, returned when freed.
MMAP_THRESHOLD_BYTES = 256 << 10
_M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)


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


def map_large_buffers() -> None:
    """Fix glibc's mmap threshold for this process (see above); a process running ranks calls it."""
    if _mallopt is not None:
        _mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def release_free_memory() -> None:
    pa.default_memory_pool().release_unused()
    if _malloc_trim is not None and _mallinfo2().fordblks >= TRIM_THRESHOLD_BYTES:
        _malloc_trim(0)
