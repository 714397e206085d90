"""A query's progress as the driver sees it while the query runs.

Every rank tells the driver when it finishes a stage (``report``, one small message on the PROGRESS
channel); the driver follows those messages on a thread of its own and turns them into ``Progress``
snapshots for a callback. Ranks run their stages in order, so a rank's next unfinished stage is the
one it is running: no start messages are needed.
"""

from __future__ import annotations

import pickle
import threading
import time

from duckflock.errors import DuckflockError
from duckflock.exchange.mux import PROGRESS, Mux
from duckflock.exec.reports import Progress, ProgressCallback, StageStats
from duckflock.plan.stages import StagePlan
from duckflock.transport.base import view


def report(mux: Mux, qid: int, stats: StageStats) -> None:
    """Tell the driver (rank 0) that this rank finished a stage."""
    mux.send_obj(0, qid, PROGRESS, stats)


class Follow:
    """A caller's side of snapshots that arrive ahead of a reply (MPI job, Flight): the callback's
    first exception stops the callbacks and is raised once the reply is in (``raise_error``), so the
    session stays in step with its ranks."""

    def __init__(self, callback: ProgressCallback | None):
        self._callback = callback
        self.error: BaseException | None = None

    def __call__(self, p: Progress) -> None:
        if self._callback is None or self.error is not None:
            return
        try:
            self._callback(p)
        except Exception as e:
            self.error = e

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error


class Tracker:
    """Folds stage completions into snapshots."""

    def __init__(self, plan: StagePlan, size: int):
        self._t0 = time.perf_counter()
        self._stages = [s.sid for s in plan.stages]
        # Per rank, the stages it runs in order: driver-only stages run on rank 0 alone.
        self._todo = {r: [s.sid for s in plan.stages if r == 0 or not s.on_driver] for r in range(size)}
        self._left = {sid: sum(sid in todo for todo in self._todo.values()) for sid in self._stages}
        self._rows = 0
        self._bytes = 0

    def record(self, stats: StageStats) -> Progress:
        self._todo[stats.rank].remove(stats.sid)
        self._left[stats.sid] -= 1
        self._rows += stats.exchange.rows_out
        self._bytes += stats.exchange.bytes_out
        return self.snapshot()

    def snapshot(self) -> Progress:
        done = sum(1 for n in self._left.values() if n == 0)
        running = {todo[0] for todo in self._todo.values() if todo}
        return Progress(
            len(self._stages), done, len(running), self._rows, self._bytes, time.perf_counter() - self._t0
        )

    @property
    def complete(self) -> bool:
        return not any(self._left.values())


class Follower:
    """The driver's thread that turns the ranks' stage reports of one query into callbacks."""

    def __init__(self, mux: Mux, qid: int, plan: StagePlan, size: int, callback: ProgressCallback):
        self._mux, self._qid, self._callback = mux, qid, callback
        self._tracker = Tracker(plan, size)
        self._stop = threading.Event()
        self.error: BaseException | None = None  # the callback's, raised by the driver after the query
        self._thread = threading.Thread(target=self._run, name="duckflock-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._callback(self._tracker.snapshot())
            while not self._tracker.complete and not self._stop.is_set():
                got = self._mux.try_recv(self._qid, PROGRESS, 0.1)
                if got is not None:
                    self._callback(self._tracker.record(pickle.loads(view(got[1]))))
        except DuckflockError:
            pass  # the query failed: the driver reports why
        except BaseException as e:
            self.error = e

    def close(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` for the reports still on their way, then stop following."""
        self._thread.join(wait_s)
        self._stop.set()
        self._thread.join()
