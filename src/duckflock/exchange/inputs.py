"""The exchanges a rank receives during one query, taken in as they arrive.

Each exchange this rank reads is received by a thread of its own from the moment the query starts,
not when the stage reading it starts: rows sent while this rank still runs an earlier stage (its
own rows included) go straight into the exchange's sink, and past the query's memory budget to a
local file, instead of piling up in the multiplexer. A stage then takes its inputs, complete, or
(an input it streams, see plan/streaming.py) as a reader of the batches while they still arrive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from duckflock.exchange.mux import Mux
from duckflock.exchange.shuffle import ExchangeStats, grant, pipe_exchange, read_exchange, stream_exchange
from duckflock.exchange.spill import QuerySpill
from duckflock.exchange.stream import StreamedInput

# Messages in flight to a stream DuckDB reads, over all its senders. Few, whatever the memory
# budget: producers sharing the rank's cores with the stream's consumer yield them instead of
# running ahead of it (past the budget into spill files, within it into memory).
CREDIT_BYTES = 4 << 20


@dataclass
class _Receiving:
    thread: threading.Thread
    stats: ExchangeStats = field(default_factory=ExchangeStats)
    data: pa.Table | None = None
    error: BaseException | None = None
    stream: StreamedInput | None = None  # read while it arrives
    readers: int = 1  # stages that take it (plan/shared_stages.py): held until the last is done
    taken: int = 0
    finished: int = 0


class QueryInputs:
    def __init__(self, mux: Mux, qid: int, spill: QuerySpill, chunk_bytes: int):
        self.mux, self.qid, self.spill = mux, qid, spill
        self.chunk_bytes = chunk_bytes  # about the size of a sender's data message
        self._receiving: dict[int, _Receiving] = {}
        self.first_error: BaseException | None = None  # of any exchange, as its thread raised it
        self._counting = threading.Lock()

    def start(
        self,
        xid: int,
        senders: list[int],
        ordered: bool,
        write: Callable[[pa.RecordBatch], None] | None = None,
        streamed: bool = False,
        readers: int = 1,
    ) -> None:
        """Begin receiving exchange ``xid`` in the background; with ``write``, each batch goes there
        as it arrives (the result, into a file) and the stage taking ``xid`` gets no rows; when
        ``streamed``, the stage takes it with ``take_stream``. ``readers``: the stages that take it
        (one, if streamed)."""
        assert readers == 1 or not streamed, "a stream is read once"
        thread = threading.Thread(target=self._run, args=(xid, senders, ordered, write), daemon=True)
        stream = self._stream(xid, senders) if streamed else None
        self._receiving[xid] = _Receiving(thread, stream=stream, readers=readers)
        thread.start()

    def _stream(self, xid: int, senders: list[int]) -> StreamedInput:
        """A streamed input whose senders wait for credit while DuckDB has it: each may have
        ``window`` messages not yet pulled, over all senders about ``CREDIT_BYTES`` (messages are
        about ``chunk_bytes``), two at least (a sender with fewer in flight would idle)."""
        window = max(2, CREDIT_BYTES // (self.chunk_bytes * len(senders)))

        def granted(sender: int, taken: int, window: int) -> None:
            grant(self.mux, self.qid, xid, sender, taken, window)

        return StreamedInput(self.spill, tuple(senders), window, granted)

    def _run(self, xid: int, senders: list[int], ordered: bool, write) -> None:
        r = self._receiving[xid]
        try:
            if r.stream is not None:
                pipe_exchange(self.mux, self.qid, xid, senders, r.stats, r.stream)
            elif write is not None:
                schema = stream_exchange(self.mux, self.qid, xid, senders, r.stats, ordered, write)
                r.data = pa.Table.from_batches([], schema)  # empty_table() cannot build unions
            else:
                r.data = read_exchange(self.mux, self.qid, xid, senders, r.stats, ordered, self.spill)
        except BaseException as e:  # the query failed elsewhere, or this rank's transport did
            r.error = e
            if self.first_error is None:
                self.first_error = e
            if r.stream is not None:
                r.stream.fail(e)

    def take(self, xid: int, stats: ExchangeStats) -> pa.Table:
        """Exchange ``xid``'s rows once all have arrived; its receiving counts go to ``stats``."""
        r = self._receiving[xid]
        t0 = time.perf_counter()
        r.thread.join()
        stats.recv_wait_s += time.perf_counter() - t0
        with self._counting:  # stages running together may take a shared exchange at once
            r.taken += 1
            first, last, data = r.taken == 1, r.taken == r.readers, r.data
            if last:
                r.data = None  # the last stage's from here: it may free the rows as DuckDB reads them
        if first:  # what this rank received, counted once
            stats.rows_in += r.stats.rows_in
            stats.bytes_in += r.stats.bytes_in
            stats.bytes_spilled += r.stats.bytes_spilled
            stats.bytes_kept += r.stats.bytes_kept
        if r.error is not None:
            raise r.error
        assert data is not None
        return data

    def streamed(self, xid: int) -> bool:
        return self._receiving[xid].stream is not None

    def take_stream(self, xid: int, more_than: float) -> pa.RecordBatchReader | pa.Table:
        """Exchange ``xid``'s rows as DuckDB pulls them, once more than ``more_than`` rows have
        arrived; if it ends before, all of them as a table. ``finish_stream`` adds up its counts
        once the stage is done."""
        r = self._receiving[xid]
        assert r.stream is not None
        if r.stream.wait_for(more_than):
            return r.stream.reader()
        r.thread.join()
        if r.error is not None:
            raise r.error
        return r.stream.whole()

    def finish_stream(self, xid: int, stats: ExchangeStats) -> int:
        """Wait for the receiving thread to end; add its counts to ``stats``; the rows read."""
        r = self._receiving[xid]
        assert r.stream is not None
        r.stream.stop()  # rows DuckDB did not pull are not needed: the senders may finish
        r.thread.join()
        stats.recv_wait_s += r.stream.wait_s
        stats.rows_in += r.stream.rows
        stats.bytes_in += r.stats.bytes_in
        stats.bytes_spilled += r.stream.spilled_bytes
        stats.bytes_kept += r.stream.kept_bytes
        if r.error is not None:
            raise r.error
        return r.stream.rows

    def done(self, xid: int) -> None:
        """A stage that read ``xid`` has finished; after the last, its rows in memory no longer count."""
        with self._counting:
            r = self._receiving[xid]
            r.finished += 1
            if r.finished < r.readers:
                return
            del self._receiving[xid]
        self.spill.release(r.stats.bytes_held)
        if r.stream is not None:
            r.stream.release()
        r.data = None

    def close(self) -> None:
        """At the end of the query (also a failed one): wait for the receivers, remove the files."""
        for r in list(self._receiving.values()):  # a stage thread still ending may pop its own
            r.thread.join(timeout=30)
        self._receiving.clear()
        self.spill.remove_files()
