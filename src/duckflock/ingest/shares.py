"""Files dealt into groups of about equal bytes: partitions of a table registered in place, or the
share of the inputs each rank reads when a load repartitions them."""

from __future__ import annotations

import heapq


def balanced(sizes: list[int], count: int) -> list[list[int]]:
    """File indexes in at most ``count`` groups of about equal bytes (largest file first, into the
    lightest group). Partition ``p`` is read by rank ``p % ranks``, so the ranks' bytes even out."""
    count = max(1, min(count, len(sizes)))
    groups: list[list[int]] = [[] for _ in range(count)]
    heap = [(0, g) for g in range(count)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        load, g = heapq.heappop(heap)
        groups[g].append(i)
        heapq.heappush(heap, (load + sizes[i], g))
    return groups


def share(sizes: list[int], rank: int, ranks: int) -> list[int]:
    """The indexes of the files ``rank`` of ``ranks`` reads: its group of about equal bytes, in
    index order (none where there are fewer files than ranks)."""
    groups = balanced(sizes, ranks)
    return sorted(groups[rank]) if rank < len(groups) else []
