"""Both ends of an exchange.

Sending: a stage's output batches are split by target rank as DuckDB produces them, buffered per
target and sent in chunks of ``chunk_bytes`` — so sending overlaps with DuckDB's work. Targets are
visited round-robin starting at rank+1 (in phase k rank r sends to r+k), so ranks do not all send to
the same peer at once. Rows for this rank itself never get serialized.

    producer batches ──split by target──▶ [buf r+1] [buf r+2] … [buf r-1]   [local]
                                             │ full? encode once (Arrow IPC) │
                                             ▼                               ▼
                                    mux.send (back-pressure)          kept as batches

Receiving: one end-of-stream message per sender carries the schema and how many data messages it
sent to this rank, so completion does not depend on message order.

Flow control: a receiver whose stage has handed the exchange to DuckDB as a stream (plan/streaming.py)
grants its senders credit on the exchange's credit channel: how many of their data messages DuckDB
has taken, and a window. A sender keeps at most ``window`` messages to it not yet taken, and
otherwise waits: the producer then yields the rank's cores to the consumer instead of outrunning it
into spill files. A window of 0 (the stage's query has ended) lifts the limit for good. Receivers
that do not stream grant nothing, and are sent to without waiting.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from duckflock.exchange.codec import decode, encode, frames_supported, from_frames, to_frames
from duckflock.exchange.kinds import ExchangeKind
from duckflock.exchange.mux import FIRST_EXCHANGE, Mux
from duckflock.exchange.partition import split_batches
from duckflock.exchange.spill import InputSink, QuerySpill
from duckflock.exchange.stream import StreamedInput
from duckflock.transport.base import view


def data_channel(xid: int) -> int:
    return FIRST_EXCHANGE + 3 * xid


def eos_channel(xid: int) -> int:
    return FIRST_EXCHANGE + 3 * xid + 1


def credit_channel(xid: int) -> int:
    return FIRST_EXCHANGE + 3 * xid + 2


# Batches are split several at a time (one piece per target from all of them), so that with many
# targets the pieces, and the work per piece (Python's, and to encode it), are not tiny: at least
# a chunk's worth, or PIECE_BYTES per target; at most SPLIT_MAX_BYTES, and never more than the
# targets' buffers hold (a chunk each).
PIECE_BYTES = 64 << 10
SPLIT_MAX_BYTES = 8 << 20


def split_bytes(chunk_bytes: int, targets: int) -> int:
    """Bytes of batches split at once."""
    return min(chunk_bytes * targets, max(chunk_bytes, min(PIECE_BYTES * targets, SPLIT_MAX_BYTES)))


def grant(mux: Mux, qid: int, xid: int, sender: int, taken: int, window: int) -> None:
    """Tell ``sender`` that ``taken`` of its data messages have been taken, and that it may keep
    ``window`` more in flight. Never blocks or raises: a failed query no longer reads credits."""
    mux.send(sender, qid, credit_channel(xid), pickle.dumps((taken, window)), check=False)


@dataclass
class Local:
    """Rows a rank sends to itself: handed over as batches, never serialized."""

    batches: list[pa.RecordBatch]


@dataclass
class ExchangeStats:
    rows_out: int = 0
    bytes_out: int = 0  # bytes put on the wire (remote targets only)
    rows_in: int = 0
    bytes_in: int = 0
    partition_s: float = 0.0
    serialize_s: float = 0.0
    send_wait_s: float = 0.0
    recv_wait_s: float = 0.0
    bytes_spilled: int = 0  # received bytes written to local files (past the query's memory budget)
    bytes_held: int = 0  # received bytes kept in memory under the query's budget (released after use)
    bytes_kept: int = 0  # received bytes kept in memory (of a streamed input: all told)


@dataclass
class ExchangeWriter:
    mux: Mux
    qid: int
    xid: int
    kind: ExchangeKind
    receivers: list[int]
    chunk_bytes: int
    options: pa.ipc.IpcWriteOptions
    stats: ExchangeStats = field(default_factory=ExchangeStats)

    def __post_init__(self) -> None:
        self.rank, self.size = self.mux.rank, self.mux.size
        # Round-robin order of remote targets: r+1, r+2, ..., r-1.
        self.order = [(self.rank + k) % self.size for k in range(1, self.size)]
        self.order = [t for t in self.order if t in self.receivers]
        self.pending: dict[int, list[pa.RecordBatch]] = {t: [] for t in self.order}
        self.pending_bytes = dict.fromkeys(self.order, 0)
        self.sent = dict.fromkeys(self.receivers, 0)
        self.local: list[pa.RecordBatch] = []
        self.local_bytes = 0
        self.unsplit: list[pa.RecordBatch] = []  # batches not split by target yet
        self.unsplit_bytes = 0
        self.split_bytes = split_bytes(self.chunk_bytes, self.size)
        self.schema: pa.Schema | None = None
        self._frames: bytes | None = None  # the serialized schema, once frames are chosen
        self.credit: dict[int, tuple[int, int]] = {}  # receiver -> (messages it took, window)

    def write(self, batch: pa.RecordBatch) -> None:
        if self.kind.routes_rows:
            self.schema = self.schema or batch.schema.remove(batch.num_columns - 1)
            self.unsplit.append(batch)
            self.unsplit_bytes += batch.nbytes
            if self.unsplit_bytes >= self.split_bytes:
                self._place(self._split())
            return
        self.schema = self.schema or batch.schema
        if batch.num_rows == 0:
            return
        if self.kind is ExchangeKind.GATHER:
            pieces = [(self.receivers[0], batch, batch.nbytes)]
        else:
            pieces = [(t, batch, batch.nbytes) for t in self.receivers]
        self._place(pieces)

    def _split(self) -> list[tuple[int, pa.RecordBatch, int]]:
        t0 = time.perf_counter()
        pieces = split_batches(self.unsplit, self.size)
        self.unsplit, self.unsplit_bytes = [], 0
        self.stats.partition_s += time.perf_counter() - t0
        return pieces

    def _place(self, pieces: list[tuple[int, pa.RecordBatch, int]]) -> None:
        """Buffer each (target, rows, bytes), and send what has reached a chunk."""
        for target, rows, nbytes in pieces:
            self.stats.rows_out += rows.num_rows
            if target == self.rank:
                self.local.append(rows)
                self.local_bytes += nbytes
            else:
                self.pending[target].append(rows)
                self.pending_bytes[target] += nbytes
        if self.local_bytes >= self.chunk_bytes:
            self._hand_over_local()
        if self.kind is ExchangeKind.BROADCAST:
            # Every target has the same buffer: serialize once, send to all.
            if self.order and self.pending_bytes[self.order[0]] >= self.chunk_bytes:
                self._flush_broadcast()
        else:
            for t in self.order:
                if self.pending_bytes[t] >= self.chunk_bytes:
                    self._flush(t)

    def _encode(self, batches: list[pa.RecordBatch]) -> tuple[object, int]:
        """The message for ``batches`` and its size: frames where the transport takes them and
        no compression is asked for, else one Arrow IPC buffer."""
        t0 = time.perf_counter()
        assert self.schema is not None
        multipart = self.mux.transport.multipart and self.options.compression is None
        if self._frames is None and multipart and frames_supported(self.schema):
            self._frames = self.schema.serialize().to_pybytes()
        if self._frames is not None:
            frames = to_frames(self._frames, batches)
            message: object = frames
            size = sum(view(f).nbytes for f in frames)
        else:
            buf = encode(self.schema, batches, self.options)
            message, size = buf, buf.size
        self.stats.serialize_s += time.perf_counter() - t0
        return message, size

    def _send(self, target: int, message: tuple[object, int]) -> None:
        t0 = time.perf_counter()
        payload, size = message
        self._wait_for_credit(target)
        self.mux.send(target, self.qid, data_channel(self.xid), payload, size)
        self.stats.send_wait_s += time.perf_counter() - t0
        self.stats.bytes_out += size
        self.sent[target] += 1

    def _wait_for_credit(self, target: int) -> None:
        """Take the credits granted so far; wait while ``target`` has a full window not taken."""
        timeout: float | None = 0.0
        while True:
            got = self.mux.try_recv(self.qid, credit_channel(self.xid), timeout)
            if got is not None:
                receiver, payload = got
                taken, window = pickle.loads(view(payload))
                before = self.credit.get(receiver)
                if before is None or before[1]:  # "no limit" (window 0) is a receiver's last word
                    self.credit[receiver] = (max(taken, before[0] if before else 0), window)
                timeout = 0.0
                continue
            taken, window = self.credit.get(target, (0, 0))
            if not window or self.sent[target] - taken < window:
                return
            timeout = None  # wait for the next grant

    def _flush(self, target: int) -> None:
        batches = self.pending[target]
        if batches:
            self._send(target, self._encode(batches))
            self.pending[target] = []
            self.pending_bytes[target] = 0

    def _hand_over_local(self) -> None:
        """This rank's own rows go to its receiving side in chunks too, so they are not all held
        here until the stage ends (the receiving side may spill them)."""
        t0 = time.perf_counter()
        self._wait_for_credit(self.rank)
        self.mux.send(self.rank, self.qid, data_channel(self.xid), Local(self.local))
        self.stats.send_wait_s += time.perf_counter() - t0
        self.sent[self.rank] += 1
        self.local, self.local_bytes = [], 0

    def _flush_broadcast(self) -> None:
        batches = self.pending[self.order[0]]
        if batches:
            message = self._encode(batches)
            for t in self.order:
                self._send(t, message)
                self.pending[t] = []
                self.pending_bytes[t] = 0

    def close(self, schema: pa.Schema) -> None:
        """Send what is left, then an end-of-stream to every receiver."""
        if self.kind.routes_rows:
            schema = schema.remove(len(schema) - 1)
            if self.unsplit:
                self.schema = schema
                self._place(self._split())
        self.schema = schema
        if self.kind is ExchangeKind.BROADCAST and self.order:
            self._flush_broadcast()
        for t in self.order:
            self._flush(t)
        if self.rank in self.receivers and self.local:
            self._hand_over_local()
        schema_bytes = schema.serialize().to_pybytes()
        for t in self.receivers:
            eos = pickle.dumps((self.sent[t], schema_bytes))
            self.mux.send(t, self.qid, eos_channel(self.xid), eos)


def _messages(
    mux: Mux, qid: int, xid: int, senders: list[int], stats: ExchangeStats
) -> Iterator[tuple[int, list[pa.RecordBatch] | None, int, pa.Schema | None]]:
    """Exchange ``xid``'s messages to this rank as they arrive: (source, batches, 0, None) for data,
    (source, None, its count of data messages, schema) for a sender's end-of-stream."""
    data_ch, eos_ch = data_channel(xid), eos_channel(xid)
    ends = expected = received_count = 0
    while ends < len(senders) or received_count < expected:
        channel, src, payload = mux.recv_any(qid, (data_ch, eos_ch))
        if channel == eos_ch:
            count, schema_bytes = pickle.loads(view(payload))
            expected += count
            ends += 1
            yield src, None, count, pa.ipc.read_schema(pa.py_buffer(schema_bytes))
            continue
        received_count += 1
        if isinstance(payload, Local):
            received = payload.batches
        elif isinstance(payload, list):
            stats.bytes_in += sum(view(f).nbytes for f in payload)
            _, received = from_frames(payload)
        else:
            stats.bytes_in += view(payload).nbytes
            _, received = decode(payload)
        yield src, received, 0, None


def read_exchange(
    mux: Mux,
    qid: int,
    xid: int,
    senders: list[int],
    stats: ExchangeStats,
    ordered: bool = False,
    spill: QuerySpill | None = None,
) -> pa.Table:
    """Every row sent to this rank through exchange ``xid``, once all senders have finished.

    Messages are taken as they arrive (not after every sender's end-of-stream), so they do not wait
    in the multiplexer's memory: rows beyond ``spill``'s budget go to a local file and a dataset
    over it is returned. ``ordered``: the senders' rows in rank order (transports deliver each
    sender's messages in the order sent); such inputs are the driver's result and stay in memory."""
    t0 = time.perf_counter()
    schema: pa.Schema | None = None
    sink: InputSink | None = None
    by_source: dict[int, list[pa.RecordBatch]] = {}
    budget = spill if spill is not None and not ordered else QuerySpill(None, 0)
    for src, received, _, end_schema in _messages(mux, qid, xid, senders, stats):
        if received is None:
            schema = schema or end_schema
        elif ordered:
            by_source.setdefault(src, []).extend(received)
        else:
            if sink is None and received:
                sink = budget.sink(received[0].schema)
            if sink is not None:
                sink.add(received)
    assert schema is not None
    if sink is None:
        sink = budget.sink(schema)
    for src in sorted(by_source):
        sink.add(by_source[src])
    data = sink.finish()
    stats.recv_wait_s += time.perf_counter() - t0
    stats.rows_in += data.num_rows
    stats.bytes_held = sink.held_bytes if budget is spill else 0
    stats.bytes_kept = sink.held_bytes
    stats.bytes_spilled = sink.spilled_bytes
    return data


def pipe_exchange(
    mux: Mux, qid: int, xid: int, senders: list[int], stats: ExchangeStats, stream: StreamedInput
) -> None:
    """Hand exchange ``xid``'s batches to ``stream`` as they arrive; a stage reads them meanwhile."""
    schema: pa.Schema | None = None
    for src, received, _, end_schema in _messages(mux, qid, xid, senders, stats):
        if received is None:
            schema = schema or end_schema
        else:
            stream.add(received, src)
    assert schema is not None
    stream.end(schema)


def stream_exchange(
    mux: Mux,
    qid: int,
    xid: int,
    senders: list[int],
    stats: ExchangeStats,
    ordered: bool,
    write: Callable[[pa.RecordBatch], None],
) -> pa.Schema:
    """Hand every batch of exchange ``xid`` to ``write`` as it arrives (the driver writing the result
    to a file) and return the schema. ``ordered``: in sender order — a sender's batches are written
    as they come while it is the first unfinished sender, and held until then otherwise."""
    t0 = time.perf_counter()
    schema: pa.Schema | None = None
    order = sorted(senders)
    held: dict[int, list[pa.RecordBatch]] = {src: [] for src in order}
    got = dict.fromkeys(order, 0)
    expected: dict[int, int] = {}
    current = 0  # index in ``order`` of the sender being written

    def emit(batches: list[pa.RecordBatch]) -> None:
        for batch in batches:
            stats.rows_in += batch.num_rows
            write(batch)

    for src, received, count, end_schema in _messages(mux, qid, xid, senders, stats):
        if received is None:
            schema = schema or end_schema
            expected[src] = count
        else:
            got[src] += 1
            if ordered and src != order[current]:
                held[src].extend(received)
            else:
                emit(received)
        while ordered and current < len(order) and expected.get(order[current]) == got[order[current]]:
            current += 1
            if current < len(order):
                emit(held.pop(order[current]))
    assert schema is not None
    stats.recv_wait_s += time.perf_counter() - t0
    return schema
