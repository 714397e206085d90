"""A stage run once for all the ranks of a process, not once per rank.

Ranks that are threads of one process each built their own hash table of a table every rank reads
whole (a broadcast read from shared storage): the skewed join at SF 10 on 2 ranks held part twice,
1.6x DuckDB's memory. A stage that reads tables only, one of them whole, now runs once, on the
process's first rank, over the partitions of all its ranks, with their cores and memory; its other
ranks send no rows, only the end of their output (or an empty part file).

Why the rows are the same: a plan is correct for any spread of partitions over ranks that keeps
partition p of every input in one place (as for exec/partition_runs.py), and a process is such a
place. Only for an output that an exchange spreads anew (not a rank's own share of replicated rows,
nor a gather in rank order), for a stage whose ranks agree on nothing while it runs (measured
broadcasts, hot keys, sort splitters), and from ``fuse_min_bytes`` read whole on: below, the copies
cost less than one DuckDB with all the threads over all the partitions (plan/stages.py,
Stage.runs_once_per_process).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa


@dataclass
class _Run:
    finished: threading.Event = field(default_factory=threading.Event)
    schema: pa.Schema | None = None  # what the first rank sent: None until then, or if it failed
    waiting: int = 0  # the other ranks still to take it


class ProcessRanks:
    """What a process's ranks share: which ranks they are (consecutive), and the fused stages under
    way, by query and stage."""

    def __init__(self, ranks: tuple[int, ...]):
        self.ranks = ranks
        self._lock = threading.Lock()
        self._runs: dict[tuple[int, int], _Run] = {}

    @property
    def first(self) -> int:
        return self.ranks[0]

    def describe(self) -> str:
        return f"ranks {self.ranks[0]}-{self.ranks[-1]}"

    def _run(self, qid: int, sid: int) -> _Run:
        with self._lock:
            return self._runs.setdefault((qid, sid), _Run(waiting=len(self.ranks) - 1))

    def finished(self, qid: int, sid: int, schema: pa.Schema | None) -> None:
        """The first rank's run ended, having sent rows of ``schema`` (None: it failed)."""
        run = self._run(qid, sid)
        run.schema = schema
        run.finished.set()

    def wait(self, qid: int, sid: int, failure: Callable[[], BaseException | None]) -> pa.Schema:
        """On another rank: wait for the first rank's run; the schema it sent. Raises what
        ``failure`` gives once there is one (the first rank's error, told to every rank)."""
        run = self._run(qid, sid)
        while run.schema is None:
            error = failure()
            if error is not None:
                raise error
            if run.finished.is_set():  # it failed, and is telling every rank: not yet told here
                time.sleep(0.01)
            else:
                run.finished.wait(0.05)
        with self._lock:
            run.waiting -= 1
            if run.waiting == 0:
                del self._runs[(qid, sid)]
        return run.schema
