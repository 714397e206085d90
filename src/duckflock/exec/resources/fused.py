"""A stage run once for all the ranks of a process, not once per rank.

Ranks that are threads of one process each built their own hash table of a table every rank reads
whole (a broadcast read from shared storage): the process held that table once per rank. A stage
that reads tables only, one of them whole, now runs once, on the process's first rank, over the
partitions of all its ranks, with their cores and memory; its other ranks send no rows, only the end
of their output (or an empty part file). So does a stage that only scans and filters partitioned
tables into an exchange, in a process of more ranks than cores: one pipeline's buffers instead of a
pipeline per rank.

Why the rows are the same: a plan is correct for any spread of partitions over ranks that keeps
partition p of every input in one place (as for exec/stages/partition_runs.py), and a process is such a
place. Only for an output that an exchange spreads anew (not a rank's own share of replicated rows,
nor a gather in rank order, nor the rows of the result as they are: each rank writes its own part
file), for a stage whose ranks agree on nothing while it runs (measured broadcasts, hot keys, sort
splitters), and from ``fuse_min_bytes`` read whole (scanned, for a scan alone) on: below, the
copies cost less than one DuckDB with all the threads over all the partitions (plan/stages.py,
Stage.runs_once_per_process).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pyarrow as pa


@dataclass
class _Run:
    done: threading.Event = field(default_factory=threading.Event)
    schema: pa.Schema | None = None  # what the first rank sent: None until then, or if it failed


class ProcessRanks:
    """What a process's ranks share: which ranks they are (consecutive), the fused stages under way
    (by query and stage, kept until every rank of the process has ended the query: a rank may
    reach a stage after the first rank has finished the whole query), and how many run now."""

    def __init__(self, ranks: tuple[int, ...]):
        self.ranks = ranks
        self._lock = threading.Lock()
        self._runs: dict[tuple[int, int], _Run] = {}
        self._ended: dict[int, int] = {}  # by query: its ranks here that have ended it
        self._running = 0  # fused stages running now (on the first rank's threads)

    @property
    def first(self) -> int:
        return self.ranks[0]

    def describe(self) -> str:
        return f"ranks {self.ranks[0]}-{self.ranks[-1]}"

    def _run(self, qid: int, sid: int) -> _Run:
        with self._lock:
            return self._runs.setdefault((qid, sid), _Run())

    def finished(self, qid: int, sid: int, schema: pa.Schema | None) -> None:
        """The first rank's run ended, having sent rows of ``schema`` (None: it failed)."""
        run = self._run(qid, sid)
        run.schema = schema
        run.done.set()

    def wait(self, qid: int, sid: int, failure: Callable[[], BaseException | None]) -> pa.Schema:
        """On another rank: wait for the first rank's run; the schema it sent. Raises what
        ``failure`` gives once there is one (the first rank's error, told to every rank)."""
        run = self._run(qid, sid)
        while run.schema is None:
            error = failure()
            if error is not None:
                raise error
            if run.done.is_set():  # it failed, and is telling every rank: not yet told here
                time.sleep(0.01)
            else:
                run.done.wait(0.05)
        return run.schema

    def ended(self, qid: int) -> None:
        """A rank here has ended query ``qid`` (done or failed); after the last, its runs go."""
        with self._lock:
            self._ended[qid] = self._ended.get(qid, 0) + 1
            if self._ended[qid] == len(self.ranks):
                del self._ended[qid]
                for key in [k for k in self._runs if k[0] == qid]:
                    del self._runs[key]

    @contextmanager
    def running(self, start: Callable[[], None], stop: Callable[[], None]) -> Iterator[None]:
        """Around a fused stage's run: ``start`` before the first of those running at once (it
        raises the memory limit of the DuckDB they share), ``stop`` after the last."""
        with self._lock:
            if self._running == 0:
                start()
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
                if self._running == 0:
                    stop()
