"""Exchanges between in-process ranks: one Mux per rank, each rank in its own thread.

Input rows and their targets are computed with DuckDB (the same ``target_sql`` the stages use); the
expected placement is recomputed independently from the key with DuckDB's hash.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duckflock.catalog.partitioning import Hashed
from duckflock.catalog.placement import target_sql
from duckflock.errors import ExecutionError, TransportError
from duckflock.exchange.codec import write_options
from duckflock.exchange.inputs import QueryInputs
from duckflock.exchange.kinds import ExchangeKind
from duckflock.exchange.mux import Mux, make_tag, split_tag
from duckflock.exchange.shuffle import (
    ExchangeStats,
    ExchangeWriter,
    credit_channel,
    data_channel,
    eos_channel,
    read_exchange,
)
from duckflock.exchange.spill import QuerySpill
from duckflock.exec.control.rank_query import describe_error
from duckflock.plan.stages import ExchangeSpec
from duckflock.transport.base import SendHandle
from duckflock.transport.inproc import InProcTransport

JOIN_S = 20  # generous: a hang fails the test, it never just makes it slow
SIZES = [1, 2, 3, 4]


# ---- running ranks ---------------------------------------------------------------------------------


def run_ranks(
    n: int,
    body: Callable[[Mux], object],
    max_inflight: int = 64 << 20,
    transports: list[InProcTransport] | None = None,
) -> tuple[list[object], list[BaseException | None]]:
    """Run ``body(mux)`` on n ranks, each with its own Mux in its own thread."""
    transports = transports or InProcTransport.group(n)
    results: list[object] = [None] * n
    errors: list[BaseException | None] = [None] * n
    done = threading.Barrier(n)

    def rank(r: int) -> None:
        mux = Mux(transports[r], max_inflight)
        try:
            results[r] = body(mux)
        except BaseException as e:
            errors[r] = e
        finally:
            # Every mux keeps running until all ranks are done, so no message is lost.
            try:
                done.wait(timeout=JOIN_S)
            finally:
                mux.close()

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=JOIN_S)
        assert not t.is_alive(), "a rank hangs"
    return results, errors


def ok(results_errors):
    results, errors = results_errors
    for r, e in enumerate(errors):
        if e is not None:
            raise AssertionError(f"rank {r} failed: {e!r}") from e
    return results


def exchange(
    mux: Mux,
    kind: str,
    batches: list[pa.RecordBatch],
    schema: pa.Schema,
    *,
    qid: int = 1,
    xid: int = 0,
    chunk_bytes: int = 1 << 20,
    compression: str = "none",
    read: bool = True,
) -> tuple[pa.Table | None, ExchangeWriter]:
    """One rank's part of one exchange: write its batches, then read what it receives."""
    n = mux.size
    receivers = [0] if kind == "gather" else list(range(n))
    w = ExchangeWriter(mux, qid, xid, ExchangeKind(kind), receivers, chunk_bytes, write_options(compression))
    for b in batches:
        w.write(b)
    w.close(schema)
    out = None
    if read and mux.rank in receivers:
        out = read_exchange(mux, qid, xid, list(range(n)), ExchangeStats())
    mux.flush(qid)
    return out, w


def rows(t: pa.Table | pa.RecordBatch) -> Counter:
    cols = [c.to_pylist() for c in t.columns]
    return Counter(zip(*cols, strict=True)) if cols else Counter()


# ---- input data ------------------------------------------------------------------------------------

_con = duckdb.connect(config={"threads": 1})
BASE_SQL = (
    "SELECT i AS id, CASE WHEN i % 17 = 0 THEN NULL ELSE (i * 7919) % 101 END AS k, "
    "'row-' || i || repeat('x', (i % 13)::INTEGER) AS s, (i * 0.5)::DECIMAL(10,1) AS d "
    "FROM range({lo}, {hi}) t(i)"
)


def hash_spec(n: int, count: int | None = None) -> ExchangeSpec:
    return ExchangeSpec(
        xid=0,
        kind=ExchangeKind.HASH,
        keys=('"k"',),
        target=Hashed(("k",), ("BIGINT",), count or n),
        producer=0,
    )


def per_rank_tables(n: int, rows_per_rank: list[int], spec: ExchangeSpec | None) -> list[pa.Table]:
    """Each rank's input; with a spec, a last ``__target`` column as the producing stage adds it."""
    out, lo = [], 0
    for count in rows_per_rank:
        sql = BASE_SQL.format(lo=lo, hi=lo + count)
        if spec is not None:
            sql = f"SELECT *, {target_sql(spec.keys, spec.target, n)} AS __target FROM ({sql})"
        out.append(_con.sql(sql).to_arrow_table())
        lo += count
    return out


def expected_rank(t: pa.Table, n: int, count: int) -> list[int]:
    """Each row's rank recomputed from its key: partition hash(k) % count lives on rank p % n."""
    _con.register("expected_in", t)
    got = _con.sql(f"SELECT (hash(CAST(k AS BIGINT)) % {count}) % {n} AS r FROM expected_in").fetchall()
    _con.unregister("expected_in")
    return [r[0] for r in got]


# ---- (a) hash exchange ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(("kind", "count"), [("hash", None), ("hash", 4), ("sort", None)])
def test_hash_exchange_places_each_row_on_its_rank_and_conserves_rows(n, kind, count):
    """Hash, range and sort exchanges all route by the producer's ``__target`` column."""
    spec = hash_spec(n, count)
    inputs = per_rank_tables(n, [700 + 211 * r for r in range(n)], spec)
    schema = inputs[0].schema
    results = ok(run_ranks(n, lambda mux: exchange(mux, kind, inputs[mux.rank].to_batches(250), schema)))

    everything = pa.concat_tables(inputs)
    # target_sql agrees with the independent computation of each row's rank.
    assert everything.column("__target").to_pylist() == expected_rank(everything, n, count or n)
    data = everything.drop_columns(["__target"])
    for r, (got, _) in enumerate(results):
        assert got.schema.equals(data.schema)
        mine = data.filter(pc.equal(everything.column("__target"), r))
        assert rows(got) == rows(mine)
    assert sum((rows(got) for got, _ in results), Counter()) == rows(data)


# ---- (b) broadcast, (c) gather ---------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_broadcast_gives_every_rank_all_rows(n):
    inputs = per_rank_tables(n, [300 + 50 * r for r in range(n)], None)
    schema = inputs[0].schema
    results = ok(
        run_ranks(n, lambda mux: exchange(mux, "broadcast", inputs[mux.rank].to_batches(128), schema))
    )
    everything = rows(pa.concat_tables(inputs))
    for got, _ in results:
        assert got.schema.equals(schema)
        assert rows(got) == everything


@pytest.mark.parametrize("n", SIZES)
def test_gather_delivers_everything_to_rank_0_only(n):
    inputs = per_rank_tables(n, [300 + 50 * r for r in range(n)], None)
    schema = inputs[0].schema
    results = ok(run_ranks(n, lambda mux: exchange(mux, "gather", inputs[mux.rank].to_batches(128), schema)))
    got0, _ = results[0]
    assert rows(got0) == rows(pa.concat_tables(inputs))
    for r in range(1, n):
        got, writer = results[r]
        assert got is None
        assert set(writer.sent) == {0}  # nothing was addressed to a rank other than 0


@pytest.mark.parametrize("n", SIZES)
def test_ordered_gather_concatenates_ranks_in_rank_order(n):
    """Each rank sends its rows as one message; the driver keeps them in rank order."""
    inputs = per_rank_tables(n, [300 + 50 * r for r in range(n)], None)
    schema = inputs[0].schema

    def body(mux):
        w = ExchangeWriter(mux, 1, 0, ExchangeKind.GATHER, [0], 1 << 62, write_options("none"))
        for b in inputs[mux.rank].to_batches(64):
            w.write(b)
        w.close(schema)
        got = (
            read_exchange(mux, 1, 0, list(range(n)), ExchangeStats(), ordered=True) if mux.rank == 0 else None
        )
        mux.flush(1)
        return got

    got = ok(run_ranks(n, body))[0]
    assert got.to_pylist() == pa.concat_tables(inputs).to_pylist()


# ---- (d) empty inputs ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", ["hash", "broadcast", "gather"])
@pytest.mark.parametrize("empty", ["some", "all"])
def test_empty_inputs_still_deliver_the_schema(n, kind, empty):
    spec = hash_spec(n) if kind == "hash" else None
    sizes = [0 if (empty == "all" or r % 2 == 1) else 200 for r in range(n)]
    inputs = per_rank_tables(n, sizes, spec)
    schema = inputs[0].schema
    data_schema = schema.remove(len(schema) - 1) if kind == "hash" else schema

    def body(mux):
        # An empty rank writes nothing at all, or one empty batch: both are legal producers.
        t = inputs[mux.rank]
        if t.num_rows:
            batches = t.to_batches()
        elif mux.rank % 4 == 1:
            batches = []
        else:
            batches = [pa.RecordBatch.from_pylist([], schema=t.schema)]
        return exchange(mux, kind, batches, schema)

    results = ok(run_ranks(n, body))
    data = pa.concat_tables(inputs)
    total = Counter()
    for r, (got, _) in enumerate(results):
        if kind == "gather" and r > 0:
            assert got is None
            continue
        assert got.schema.equals(data_schema)
        total += rows(got)
    expected = rows(data.select(data_schema.names))
    if kind == "broadcast":
        expected = Counter({k: v * n for k, v in expected.items()})
    assert total == expected


# ---- (e) many small messages and back-pressure ----------------------------------------------------


class _SlowHandle(SendHandle):
    def __init__(self, owner: SlowTransport):
        self.owner = owner
        self.polls = 3
        self.finished = False

    def done(self) -> bool:
        if not self.finished:
            self.polls -= 1
            if self.polls <= 0:
                self.finished = True
                with self.owner.lock:
                    self.owner.outstanding -= 1
        return self.finished


class SlowTransport(InProcTransport):
    """Delivers at once but reports a send complete only after a few polls, like a real network:
    counts how many sends are unfinished at the same time."""

    def __init__(self, rank, mailboxes):
        super().__init__(rank, mailboxes)
        self.lock = threading.Lock()
        self.outstanding = 0
        self.max_outstanding = 0
        self.sends = 0

    def isend(self, dest, tag, data):
        super().isend(dest, tag, data)
        with self.lock:
            self.sends += 1
            self.outstanding += 1
            self.max_outstanding = max(self.max_outstanding, self.outstanding)
        return _SlowHandle(self)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_small_chunks_and_tiny_inflight_limit_still_deliver_everything(n, compression):
    spec = hash_spec(n)
    inputs = per_rank_tables(n, [1500] * n, spec)
    schema = inputs[0].schema
    transports = SlowTransport.group(n)

    def body(mux):
        return exchange(
            mux, "hash", inputs[mux.rank].to_batches(64), schema, chunk_bytes=1024, compression=compression
        )

    results = ok(run_ranks(n, body, max_inflight=1, transports=transports))
    everything = pa.concat_tables(inputs)
    data = everything.drop_columns(["__target"])
    for r, (got, writer) in enumerate(results):
        mine = data.filter(pc.equal(everything.column("__target"), r))
        assert rows(got) == rows(mine)
        assert sum(c for t, c in writer.sent.items() if t != r) >= 10 * (n - 1)  # many chunks
    for t in transports:
        assert t.sends > 10
        # Back-pressure: a producer waits until its previous message completed before queueing more.
        assert t.max_outstanding == 1, t.max_outstanding


# ---- (f) failures -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("failing", ["first", "last"])
def test_failure_on_one_rank_fails_the_exchange_on_every_rank(n, failing):
    bad = 0 if failing == "first" else n - 1
    spec = hash_spec(n)
    inputs = per_rank_tables(n, [300] * n, spec)
    schema = inputs[0].schema

    def body(mux):
        if mux.rank == bad:
            mux.fail(1, 3, "disk on fire")
            # The failing rank itself also sees the failure when it waits.
            return read_exchange(mux, 1, 0, list(range(n)), ExchangeStats())
        return exchange(mux, "hash", inputs[mux.rank].to_batches(100), schema)

    _, errors = run_ranks(n, body)
    for r, e in enumerate(errors):
        assert isinstance(e, ExecutionError), (r, e)
        assert e.rank == bad and e.stage == 3
        assert f"rank {bad}" in str(e) and "disk on fire" in str(e)


def test_a_rank_failing_after_another_reports_the_first_failure():
    """Rank 0 fails first and tells every rank; rank 1, failing after it was told (what it hit is
    the echo), ends the query with rank 0's failure and tells none of its own."""

    def body(mux):
        if mux.rank == 0:
            return mux.report_failure(1, 3, "disk on fire")
        deadline = time.monotonic() + JOIN_S
        while mux.told_error(1) is None:
            assert time.monotonic() < deadline, "rank 0's failure never arrived"
            time.sleep(0.01)
        return mux.report_failure(1, 4, "interrupted")

    results, errors = run_ranks(2, body)
    assert errors == [None, None]
    for e in results:
        assert isinstance(e, ExecutionError) and (e.rank, e.stage, e.cause) == (0, 3, "disk on fire")


# ---- (g) query isolation ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3])
def test_messages_of_a_finished_query_do_not_leak_into_the_next(n):
    spec = hash_spec(n)
    old = per_rank_tables(n, [400] * n, spec)
    late = [t.slice(0, 50) for t in old]
    new = per_rank_tables(n, [100 + 10 * r for r in range(n)], spec)
    schema = old[0].schema
    step = threading.Barrier(n)
    old_q, new_q = 5, 6

    def body(mux):
        r = mux.rank
        # Query 5 sends but nobody reads; it is finished while its messages sit in the inboxes.
        exchange(mux, "hash", old[r].to_batches(), schema, qid=old_q, read=False)
        step.wait(JOIN_S)
        mux.finish(old_q)
        step.wait(JOIN_S)
        # Late messages of the finished query arrive after finish: they must be dropped too.
        exchange(mux, "hash", late[r].to_batches(), schema, qid=old_q, read=False)
        got, _ = exchange(mux, "hash", new[r].to_batches(), schema, qid=new_q)
        step.wait(JOIN_S)
        leftovers = []
        for channel in (data_channel(0), eos_channel(0)):
            with contextlib.suppress(TransportError):
                leftovers.append(mux.recv(old_q, channel, timeout=0.1))
        return got, leftovers

    results = ok(run_ranks(n, body))
    everything = pa.concat_tables(new)
    data = everything.drop_columns(["__target"])
    for r, (got, leftovers) in enumerate(results):
        assert rows(got) == rows(data.filter(pc.equal(everything.column("__target"), r)))
        assert leftovers == []


def test_a_channel_past_its_bits_is_refused_not_taken_for_another_query():
    top = credit_channel(10_919)  # the last exchange whose channels fit
    assert split_tag(make_tag(5, top)) == (5, top)
    with pytest.raises(TransportError, match="too many exchanges"):
        make_tag(5, data_channel(10_920))


class CountingTransport(InProcTransport):
    """Counts polls; ``wakes`` False plays a transport that must be polled for arrivals (MPI)."""

    wakes = True

    def __init__(self, rank, mailboxes):
        super().__init__(rank, mailboxes)
        self.polls = 0

    def poll(self):
        self.polls += 1
        return super().poll()

    def set_waker(self, wake):
        return super().set_waker(wake) if self.wakes else False


class PolledTransport(CountingTransport):
    wakes = False


@pytest.mark.parametrize("kind", [CountingTransport, PolledTransport])
def test_an_idle_multiplexer_sleeps_until_a_message_or_a_send_wakes_it(kind):
    """Told of arrivals, the idle multiplexer polls once per 50 ms wait at most, not in a loop; either
    way a message sent after the quiet spell arrives (the sender's multiplexer woken by the send)."""
    a, b = kind.group(2)
    muxes = [Mux(a), Mux(b)]
    try:
        time.sleep(0.1)  # settle
        before = b.polls
        time.sleep(0.3)
        quiet_polls = b.polls - before
        muxes[0].send_obj(1, 7, 9, "after the quiet")
        assert muxes[1].recv_obj(7, 9, timeout=JOIN_S) == (0, "after the quiet")
    finally:
        for m in muxes:
            m.close()
    if kind.wakes:
        assert quiet_polls <= 0.3 / 0.05 + 2
    else:
        assert quiet_polls > 0.3 / 0.05 + 2  # polled: 1-5 ms sleeps


# ---- (h) flow control of streamed inputs -------------------------------------------------------------

MESSAGE_ROWS = 100
STREAM_CHUNK = 8 << 20  # what the receiver assumes a message holds: a window of 2 messages


def streamed_exchange(
    mux: Mux,
    messages: int,
    consume: Callable[[QueryInputs, Callable[[], None]], object],
    all_ranks: threading.Barrier,
    spill: QuerySpill | None = None,
) -> object:
    """Every rank sends ``messages`` messages of MESSAGE_ROWS rows to every rank (a producer thread:
    one message, then the rest once every rank's ``consume`` has called its second argument) while
    ``consume`` reads this rank's input as a stream, then ends it as a stage does."""
    n = mux.size
    received = QueryInputs(mux, 1, spill or QuerySpill(None, 0), STREAM_CHUNK)
    received.start(0, list(range(n)), ordered=False, streamed=True)
    batch = pa.record_batch({"v": pa.array(range(MESSAGE_ROWS * n), pa.int64())})
    batch = batch.append_column("__target", pa.array([i % n for i in range(MESSAGE_ROWS * n)], pa.uint16()))
    errors: list[BaseException] = []
    go = threading.Event()

    def produce() -> None:
        w = ExchangeWriter(mux, 1, 0, ExchangeKind.HASH, list(range(n)), 1, write_options("none"))
        try:
            for i in range(messages):
                w.write(batch)  # chunks of 1 byte: each write sends one message to every rank
                if i == 0:
                    go.wait(JOIN_S)
            w.close(batch.schema)
        except BaseException as e:
            errors.append(e)

    def release() -> None:
        all_ranks.wait(JOIN_S)
        go.set()

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        out = consume(received, release)
        stats = ExchangeStats()
        received.finish_stream(0, stats)
        producer.join(JOIN_S)
        assert not producer.is_alive(), "the producer waits for credit nobody grants"
        if errors:
            raise errors[0]
        return out, stats.rows_in
    finally:
        received.done(0)
        received.close()
        mux.flush(1)


def credited_ranks(n: int, messages: int, consume, spill: Callable[[], QuerySpill] | None = None) -> list:
    all_ranks = threading.Barrier(n)

    def body(mux: Mux) -> object:
        return streamed_exchange(mux, messages, consume, all_ranks, spill() if spill else None)

    return ok(run_ranks(n, body))


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("spilled", [False, True])
def test_senders_wait_for_a_stream_that_is_pulled_slowly(n, spilled, tmp_path):
    """Once DuckDB has the stream, at most a window of messages per sender waits unread (plus what
    is in flight when the credit is first granted), also when every batch goes through a spill
    file; before the credits all 40 would."""
    messages = 40

    def consume(received: QueryInputs, go: Callable[[], None]):
        reader = received.take_stream(0, 0)  # grants the first credit
        go()  # the rest is sent while the stream is pulled
        stream = received._receiving[0].stream
        waiting = []
        for b in reader:
            waiting.append(stream._arrived - stream.rows)
            time.sleep(0.002)  # a consumer slower than its producers
            assert b.num_rows == MESSAGE_ROWS
        return max(waiting)

    def spill() -> QuerySpill:
        return QuerySpill(tmp_path, 1)  # no batch fits: every one is written to a file

    for most, rows_in in credited_ranks(n, messages, consume, spill if spilled else None):
        assert rows_in == messages * MESSAGE_ROWS * n
        assert most <= (2 + 2) * n * MESSAGE_ROWS, most
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("n", [2, 3])
def test_no_sender_waits_on_a_stream_not_pulled(n):
    """A stage that waits for the whole stream before reading it (its build side is larger), or stops
    pulling early (DuckDB skips a probe side when the build side is empty), never leaves its
    senders waiting for credit: the exchange ends within the bound."""
    messages = 20

    def whole(received: QueryInputs, go: Callable[[], None]):
        go()
        return received.take_stream(0, messages * MESSAGE_ROWS * n).num_rows

    def first_batch_only(received: QueryInputs, go: Callable[[], None]):
        reader = received.take_stream(0, 0)
        go()
        return next(iter(reader)).num_rows

    for got, _ in credited_ranks(n, messages, whole):
        assert got == messages * MESSAGE_ROWS * n
    for got, rows_in in credited_ranks(n, messages, first_batch_only):
        assert got == rows_in == MESSAGE_ROWS


# ---- property: random tables through a hash exchange ------------------------------------------------

_key = st.none() | st.integers(-3, 3) | st.integers(-(2**62), 2**62)
_text = st.none() | st.sampled_from(["", "a", "b", "ü", "long" * 20]) | st.text(max_size=6)


@st.composite
def sharded(draw):
    n = draw(st.integers(1, 4))
    skew = draw(st.booleans())
    key = st.just(7) if skew else _key
    shards = [draw(st.lists(st.tuples(key, _text), max_size=30)) for _ in range(n)]
    return n, shards


@settings(max_examples=30)
@given(sharded(), st.sampled_from([64, 1 << 20]))
def test_random_tables_through_a_hash_exchange(case, chunk_bytes):
    n, shards = case
    spec = hash_spec(n)
    inputs = []
    for shard in shards:
        t = pa.table(
            {
                "k": pa.array([k for k, _ in shard], pa.int64()),
                "s": pa.array([s for _, s in shard], pa.string()),
            }
        )
        _con.register("shard", t)
        inputs.append(
            _con.sql(
                f"SELECT *, {target_sql(spec.keys, spec.target, n)} AS __target FROM shard"
            ).to_arrow_table()
        )
        _con.unregister("shard")
    schema = inputs[0].schema
    results = ok(
        run_ranks(
            n,
            lambda mux: exchange(
                mux, "hash", inputs[mux.rank].to_batches(7), schema, chunk_bytes=chunk_bytes
            ),
        )
    )
    data = pa.concat_tables(inputs).drop_columns(["__target"])
    total = Counter()
    for r, (got, _) in enumerate(results):
        assert got.schema.equals(data.schema)
        # Each row received here belongs here, by the independent hash of its key.
        assert all(x == r for x in expected_rank(got, n, n))
        total += rows(got)
    assert total == rows(data)


def test_a_streamed_input_that_fails_is_reported_by_its_own_error_not_duckdbs_wrapper():
    # DuckDB pulling a reader whose next batch raises wraps the error in its text, with a traceback.
    lost = TransportError("worker 2 at grpc+tcp://10.0.0.3:4000 sent nothing for 5 s")

    def batches():
        yield pa.record_batch([pa.array([1])], names=["a"])
        raise lost

    con = duckdb.connect()
    con.register("__x0", pa.RecordBatchReader.from_batches(pa.schema([("a", pa.int64())]), batches()))
    with pytest.raises(duckdb.Error) as wrapped:
        con.sql("SELECT sum(a) FROM __x0").fetchall()
    assert "Traceback" in str(wrapped.value)
    assert "Traceback" not in describe_error(wrapped.value)  # cut from DuckDB's text for the user
    assert describe_error(wrapped.value, lost) == str(lost)
    # A DuckDB error of the stage's own is not taken for the receiving thread's.
    with pytest.raises(duckdb.Error) as own:
        con.sql("SELECT error('a cause of its own')").fetchall()
    assert describe_error(own.value, lost) == describe_error(own.value)


def test_ranks_of_one_process_hand_over_arrow_buffers_and_copy_what_a_sender_may_reuse():
    """Arrow buffers and bytes reach the receiver as they are (no copy of the exchanged data); a
    writable buffer is copied, so changing it after sending changes nothing the receiver has."""
    sender, receiver = InProcTransport.group(2)
    arrow, reused = pa.py_buffer(b"rows"), bytearray(b"head")
    meta_sent = b"meta"
    sender.isend(1, 7, [meta_sent, arrow, reused])
    reused[:] = b"XXXX"
    [(src, tag, (meta, got_arrow, got_reused))] = receiver.poll()
    assert (src, tag, meta) == (0, 7, b"meta")
    assert got_arrow is arrow and meta is meta_sent
    assert bytes(got_reused) == b"head"
