"""An exchange read as a stream: DuckDB takes its batches while they still arrive.

The receiving thread adds batches; the stage's DuckDB query pulls them through a RecordBatchReader.
Producers usually outpace the consumer (it may still be building a join's other side, and shares
the rank's cores with the producer), so what waits is bounded: in memory while the query's budget
for received data has room (exec/resources/budget.py: its part of the rank's memory), the rest in local
Arrow IPC files of ``FILE_BYTES`` each, queued behind the batches in memory and removed once read.
Row order is not kept: only unordered exchanges are streamed.

From the moment the stage hands the stream to DuckDB until its query has ended, the senders wait
for credit (exchange/shuffle.py): each is told how many of its messages have been taken, and a
message counts as taken once DuckDB has pulled up to it — spilled rows included, whose file is handed
to the reader ahead of the mark. Before then (the stage waits to know the stream is the larger side,
or runs an earlier stage) senders are not limited, and when the query has ended they are told so, so
no sender waits on a stage that is not reading.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from duckflock.exchange.spill import QuerySpill

_END = object()
_names = itertools.count()

FILE_BYTES = 32 << 20  # a spill file is handed to the reader once this full (or at the end)


# Tells a sender how many of its messages have been taken and how many more it may have in flight
# (0: no limit).
Grant = Callable[[int, int, int], None]


@dataclass(frozen=True)
class _Taken:
    """Queued after a sender's message: DuckDB has pulled it once it reaches this."""

    sender: int


class StreamedInput:
    def __init__(
        self,
        spill: QuerySpill,
        senders: tuple[int, ...] = (),
        window: int = 0,
        grant: Grant | None = None,
    ):
        """``senders`` are granted credit through ``grant``, ``window`` messages each, while DuckDB
        has the stream (never without ``grant``); past ``spill``'s budget, batches spill."""
        self.spill = spill
        self._senders, self._window, self._grant = senders, window, grant
        self._taken: dict[int, int] = {}
        self._gated = False  # DuckDB has the stream: messages are taken when it pulls them
        self._over = False  # the stage's query has ended: later batches are not needed
        self.schema: pa.Schema | None = None
        self.known = threading.Event()  # the schema is known (or receiving failed)
        self.rows = 0  # handed to DuckDB so far
        self.wait_s = 0.0  # DuckDB waiting for batches to arrive
        self.held_bytes = 0  # in memory now, counted against the budget
        self.kept_bytes = 0  # kept in memory, all told
        self.spilled_bytes = 0
        self._queue: queue.Queue = queue.Queue()
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._path: Path | None = None
        self._file_bytes = 0
        self._lock = threading.Lock()
        self._adding = threading.Lock()
        self._arrival = threading.Condition()
        self._arrived = 0  # rows added so far
        self._ended = False

    # ---- the receiving thread ------------------------------------------------------------------
    def add(self, batches: list[pa.RecordBatch], sender: int) -> None:
        """One data message of ``sender``."""
        with self._adding:  # not while ``stop`` empties the queue: no mark may stay behind it
            self._add(batches, sender)
        with self._arrival:
            self._arrived += sum(b.num_rows for b in batches)
            self._arrival.notify_all()

    def _add(self, batches: list[pa.RecordBatch], sender: int) -> None:
        with self._lock:
            over = self._over
        if over:
            self._count(sender)
            return
        if self.schema is None and batches:
            self._know(batches[0].schema)
        spilled = False
        for b in batches:
            if self.spill.reserve(b.nbytes):
                with self._lock:
                    self.held_bytes += b.nbytes
                    self.kept_bytes += b.nbytes
                self._queue.put(b)
            else:
                self._spill(b)
                spilled = True
        with self._lock:
            gated = self._gated
            if not gated:  # taken on arrival (counted in the credit DuckDB's taking it will start with)
                self._bump(sender)
        if gated:
            if spilled:
                self._hand_over_file()  # its rows are read before the mark is reached
            self._queue.put(_Taken(sender))

    def end(self, schema: pa.Schema) -> None:
        """Every sender has finished (``schema``: the exchange's, should no batch have come)."""
        if self.schema is None:
            self._know(schema)
        self._hand_over_file()
        self._queue.put(_END)
        self._end()

    def fail(self, error: BaseException) -> None:
        self._queue.put(error)
        self.known.set()
        self._end()

    def _end(self) -> None:
        with self._arrival:
            self._ended = True
            self._arrival.notify_all()

    def wait_for(self, rows: float) -> bool:
        """Whether more than ``rows`` rows arrive before the stream ends (waits until one happens)."""
        with self._arrival:
            while self._arrived <= rows and not self._ended:
                self._arrival.wait()
            return self._arrived > rows

    def _count(self, sender: int) -> int:
        with self._lock:
            return self._bump(sender)

    def _bump(self, sender: int) -> int:
        """One more message of ``sender`` taken (with ``_lock`` held)."""
        self._taken[sender] = taken = self._taken.get(sender, 0) + 1
        return taken

    def _grant_all(self, taken: dict[int, int], window: int) -> None:
        if self._grant is not None:
            for sender in self._senders:
                self._grant(sender, taken.get(sender, 0), window)

    def _unhold(self, batch: pa.RecordBatch) -> None:
        """A batch leaves the memory queue: it no longer counts against the budget."""
        with self._lock:
            self.held_bytes -= batch.nbytes
        self.spill.release(batch.nbytes)

    def _know(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.known.set()

    def _spill(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            assert self.spill.directory is not None  # only spilled with a spill directory
            self._path = self.spill.directory / f"stream-{next(_names)}.arrow"
            with self.spill.lock:
                self.spill.files.append(self._path)
            self._writer = pa.ipc.new_file(str(self._path), batch.schema)
        self._writer.write_batch(batch)
        self.spilled_bytes += batch.nbytes
        self._file_bytes += batch.nbytes
        if self._file_bytes >= FILE_BYTES:
            self._hand_over_file()

    def _hand_over_file(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._queue.put(self._path)
            self._writer, self._path, self._file_bytes = None, None, 0

    # ---- the stage -----------------------------------------------------------------------------
    def reader(self) -> pa.RecordBatchReader:
        """The batches as DuckDB pulls them; call once ``known`` is set."""
        if self.schema is None:  # receiving failed before any batch: its error
            raise self._queue.get()
        with self._lock:
            self._gated = self._grant is not None
            taken = dict(self._taken)
        self._grant_all(taken, self._window)
        return pa.RecordBatchReader.from_batches(self.schema, self._batches())

    def _batches(self) -> Iterator[pa.RecordBatch]:
        while True:
            t0 = time.perf_counter()
            item = self._queue.get()
            self.wait_s += time.perf_counter() - t0
            if item is _END:
                break
            if isinstance(item, _Taken):
                taken = self._count(item.sender)
                if self._grant is not None:
                    self._grant(item.sender, taken, self._window)
                continue
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, Path):
                yield from self._read_file(item)
                continue
            self._unhold(item)
            self.rows += item.num_rows
            yield item

    def whole(self) -> pa.Table:
        """Every row, once the stream has ended: the batches in memory as they are (still counted
        until ``release``), the spill files memory-mapped (pages the kernel can drop)."""
        assert self.schema is not None
        batches: list[pa.RecordBatch] = []
        while (item := self._queue.get()) is not _END:
            if isinstance(item, _Taken):
                continue  # taken on arrival: the stream was not pulled
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, Path):
                batches.extend(pa.ipc.open_file(pa.memory_map(str(item))).read_all().to_batches())
            else:
                batches.append(item)
        self.rows = sum(b.num_rows for b in batches)
        return pa.Table.from_batches(batches, self.schema)

    def _read_file(self, path: Path) -> Iterator[pa.RecordBatch]:
        """A spill file's batches, read one at a time (not mapped: each is freed once DuckDB has
        it), then the file is removed."""
        with pa.OSFile(str(path)) as f:
            spilled = pa.ipc.open_file(f)
            for i in range(spilled.num_record_batches):
                batch = spilled.get_batch(i)
                self.rows += batch.num_rows
                yield batch
        path.unlink(missing_ok=True)

    def stop(self) -> None:
        """The stage's query has ended, whether or not it pulled every batch (DuckDB skips a join's
        probe side when the other side is empty): batches still queued and any still to come are
        dropped, and the senders are told they may send without limit, so none waits for a reader
        that has gone."""
        with self._adding:
            with self._lock:
                self._over = True
                gated, self._gated = self._gated, False
            if self._writer is not None:  # a file not handed over: never to be read
                self._writer.close()
                assert self._path is not None
                self._path.unlink(missing_ok=True)
                self._writer, self._path, self._file_bytes = None, None, 0
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, _Taken):
                    self._count(item.sender)
                elif isinstance(item, pa.RecordBatch):
                    self._unhold(item)
                elif isinstance(item, Path):
                    item.unlink(missing_ok=True)
                else:
                    self._queue.put(item)  # the end or an error: left for whoever waits on it
                    break
            if gated:
                with self._lock:
                    taken = dict(self._taken)
                self._grant_all(taken, 0)

    def release(self) -> None:
        """The stage has ended (also early, on failure): batches still queued no longer count."""
        with self._lock:
            held, self.held_bytes = self.held_bytes, 0
        self.spill.release(held)
