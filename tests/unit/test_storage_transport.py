"""The storage transport on its own: several ranks' transports in this process over a temporary
directory, each polled by the test as its multiplexer would poll it; then a Mux over them."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

from duckflock.exchange.mux import Mux
from duckflock.transport import storage
from duckflock.transport.storage import (
    WHOLE_READ_BYTES,
    ObjectStore,
    StorageTransport,
    combine,
    decode,
    encode,
    index_bytes,
    open_location,
    read_messages,
    remove_job,
)
from s3_support import bucket

BOUND_S = 20.0


@pytest.fixture
def group(tmp_path) -> Iterator[list[StorageTransport]]:
    ts = [StorageTransport(str(tmp_path), "job", r, 3, peer_timeout_s=5.0) for r in range(3)]
    yield ts
    for t in ts:
        t.close()


def receive(t: StorageTransport, count: int) -> list[tuple[int, int, object]]:
    """``count`` messages, polling as an idle multiplexer would (which also flushes sends)."""
    got: list[tuple[int, int, object]] = []
    deadline = time.monotonic() + BOUND_S
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} messages arrived"
        got += t.poll()
        time.sleep(0.001)
    return got


def drain(*senders: StorageTransport) -> None:
    """The multiplexer's poll after its round of sends, then one with nothing sent since (it is
    idle): which flushes."""
    for t in senders:
        t.poll()
        t.poll()


def test_object_layout_round_trips_single_and_multipart_messages():
    msgs = [(5, b"abc"), (7, [b"head", np.arange(10, dtype=np.int64), b""]), (1 << 27, b"")]
    parts = encode(msgs)
    obj = pa.py_buffer(b"".join(bytes(memoryview(p).cast("B")) for p in parts))
    out = decode(obj)
    assert out[0][0] == 5 and out[0][1].to_pybytes() == b"abc"
    tag, frames = out[1]
    assert tag == 7 and [f.to_pybytes() for f in frames] == [b"head", np.arange(10).tobytes(), b""]
    # Aligned as the object is (a mapped file: to a page), so Arrow buffers rebuilt on them are.
    assert all((f.address - obj.address) % 64 == 0 for f in frames[:2])
    assert out[2][0] == 1 << 27 and out[2][1].to_pybytes() == b""


def test_combined_object_holds_a_block_per_destination_read_by_range():
    """Forty destinations, most without a block: each reads its own messages; an empty block costs
    the index only, and a large object is read as index and block, not whole."""
    ranks = 40
    big = np.arange(WHOLE_READ_BYTES, dtype=np.uint8)
    blocks = {3: [(1, b"three")], 17: [(2, [b"h", big]), (3, b"")], 39: [(4, b"last")]}
    obj = b"".join(bytes(memoryview(p).cast("B")) for p in combine(blocks, ranks))
    reads: list[tuple[int, int]] = []
    for dest in range(ranks):
        got = read_messages(CountingFile(obj, reads), dest, ranks)
        want = blocks.get(dest, [])
        assert [tag for tag, _ in got] == [tag for tag, _ in want]
        if dest == 17:
            assert [bytes(f) for f in got[0][1]] == [b"h", big.tobytes()] and bytes(got[1][1]) == b""
        elif want:
            assert bytes(got[0][1]) == want[0][1]
        block = reads[1:]
        assert reads[0] == (0, index_bytes(ranks)) and len(block) == (1 if want else 0), (dest, reads)
        reads.clear()
    small = combine({0: [(5, b"a")], 2: [(6, b"b")]}, 3)
    assert [bytes(p) for _, p in read_messages(CountingFile(join(small), reads), 2, 3)] == [b"b"]
    assert len(reads) == 1  # a small object: one read, whole
    with pytest.raises(ValueError, match="of 3 ranks, read by one of 4"):
        read_messages(CountingFile(join(small), reads), 0, 4)


def join(parts: list) -> bytes:
    return b"".join(bytes(memoryview(p).cast("B")) for p in parts)


class CountingFile:
    """An object in memory, read as ``read_messages`` reads a file, its reads recorded as (offset,
    length)."""

    def __init__(self, data: bytes, reads: list[tuple[int, int]]):
        self.data, self.reads, self.at = pa.py_buffer(data), reads, 0

    def size(self) -> int:
        return self.data.size

    def seek(self, offset: int) -> None:
        self.at = offset

    def read_buffer(self, nbytes: int) -> pa.Buffer:
        self.reads.append((self.at, nbytes))
        self.at += nbytes
        return self.data.slice(self.at - nbytes, nbytes)


@pytest.mark.parametrize("medium", ["directory", "bucket"])
def test_combined_objects_read_by_range_from_a_directory_and_a_bucket(tmp_path, medium):
    ranks = 6
    blocks = {d: [(d, bytes([d]) * (d * 100_000))] for d in (1, 4, 5)}
    with contextlib.ExitStack() as stack:
        if medium == "bucket":
            stack.enter_context(bucket("exchange"))
        store = ObjectStore(*open_location(str(tmp_path) if medium == "directory" else "s3://exchange/x"))
        store.make_dirs("msg", "tmp")
        store.put("msg/o", combine(blocks, ranks))
        for dest in range(ranks):
            with store.open("msg/o") as f:
                got = read_messages(f, dest, ranks)
            assert [(tag, bytes(p)) for tag, p in got] == [(t, bytes(p)) for t, p in blocks.get(dest, [])]


def test_messages_arrive_in_order_per_source_with_their_tags(group):
    for i in range(50):
        group[0].isend(2, i % 3, f"a{i}".encode())
        group[1].isend(2, 100 + i, f"b{i}".encode())
    drain(group[0], group[1])
    got = receive(group[2], 100)
    by_src = {s: [(tag, bytes(p)) for src, tag, p in got if src == s] for s in (0, 1)}
    assert by_src[0] == [(i % 3, f"a{i}".encode()) for i in range(50)]
    assert by_src[1] == [(100 + i, f"b{i}".encode()) for i in range(50)]


def test_sends_in_one_round_share_an_object_and_a_lone_one_is_not_held(group, tmp_path):
    for i in range(20):
        group[0].isend(1, 1, bytes([i]) * 10)
    group[0].isend(2, 3, b"to two")
    assert group[0]._seq == 0  # buffered until the mux's next poll
    group[0].poll()  # sent since the last poll: still a round of sends under way
    group[0].poll()  # idle: flushed, as one object for both destinations
    assert group[0]._seq == 1
    assert [(tag, bytes(p)) for _, tag, p in receive(group[2], 1)] == [(3, b"to two")]
    assert [bytes(p) for _, _, p in receive(group[1], 20)] == [bytes([i]) * 10 for i in range(20)]
    t0 = time.monotonic()
    group[0].isend(1, 2, b"ping")
    group[0].poll()
    group[0].poll()
    receive(group[1], 1)
    assert time.monotonic() - t0 < 1.0


def test_large_messages_span_several_objects_in_order(tmp_path):
    ts = [StorageTransport(str(tmp_path), "job", r, 2, flush_bytes=1 << 20) for r in range(2)]
    try:
        rng = np.random.default_rng(0)
        big = [rng.integers(0, 255, size=n, dtype=np.uint8) for n in (3 << 20, 100, 1 << 20, 5, 2 << 20)]
        handles = [ts[0].isend(1, i, [b"h", b]) for i, b in enumerate(big)]
        assert ts[0]._seq >= 3  # flushed on size while sending, before any poll
        drain(ts[0])
        got = receive(ts[1], len(big))
        assert [tag for _, tag, _ in got] == list(range(len(big)))
        for (_, _, parts), b in zip(got, big, strict=True):
            assert bytes(parts[0]) == b"h" and np.array_equal(np.frombuffer(parts[1], np.uint8), b)
        assert all(h.done() for h in handles)
    finally:
        for t in ts:
            t.close()


def test_objects_every_rank_has_passed_are_deleted_and_the_job_removed(group, tmp_path):
    """Rank 2 holds no block of rank 0's objects, yet they wait for it to pass them (by their
    name) as well as for rank 1 to read them, each learnt from the rank's heartbeat."""
    for _ in range(3):
        group[0].isend(1, 1, b"x" * 1000)
        drain(group[0])
        receive(group[1], 1)
    deadline = time.monotonic() + BOUND_S
    while os.listdir(tmp_path / "job" / "msg"):
        assert time.monotonic() < deadline, os.listdir(tmp_path / "job" / "msg")
        time.sleep(0.05)
    assert group[2]._expected[0] == 3
    assert os.listdir(tmp_path / "job" / "tmp") == []
    for t in group:
        t.close()
    remove_job(str(tmp_path), "job")
    remove_job(str(tmp_path), "job")  # already gone: nothing to do
    assert not (tmp_path / "job").exists()


def test_a_beat_reads_few_peers_progress_and_objects_still_go(tmp_path, monkeypatch):
    """At 5 ranks with one peer's progress read a beat, rank 0's objects wait for all four peers,
    read in turn, and are deleted; no beat read more than one."""
    monkeypatch.setattr(storage, "PROGRESS_READS", 1)
    ts = [StorageTransport(str(tmp_path), "job", r, 5, peer_timeout_s=30.0) for r in range(5)]
    try:
        t0 = time.monotonic()
        for dest in range(1, 5):
            ts[0].isend(dest, 1, b"x" * 100)
        drain(ts[0])
        for t in ts[1:]:
            receive(t, 1)
        deadline = time.monotonic() + BOUND_S
        while os.listdir(tmp_path / "job" / "msg"):
            assert time.monotonic() < deadline, os.listdir(tmp_path / "job" / "msg")
            time.sleep(0.05)
        beats = (time.monotonic() - t0) / storage.HEARTBEAT_S + 1
        assert 4 <= ts[0].progress_gets <= beats, (ts[0].progress_gets, beats)
    finally:
        for t in ts:
            t.close()


def test_a_peer_without_heartbeat_is_lost_and_a_closed_one_is_not(tmp_path):
    ts = [StorageTransport(str(tmp_path), "job", r, 3, peer_timeout_s=1.5) for r in range(3)]
    try:
        time.sleep(0.5)
        assert ts[0].peer_failure() is None
        ts[2].close()  # said goodbye: not a failure
        ts[1]._stop.set()  # silenced without a goodbye, as a killed process would be
        deadline = time.monotonic() + BOUND_S
        while ts[0].peer_failure() is None:
            assert time.monotonic() < deadline, "the silent peer was never reported"
            time.sleep(0.1)
        assert "rank 1 wrote no heartbeat" in (ts[0].peer_failure() or "")
    finally:
        ts[0].close()
        ts[1].close()


def test_a_mux_over_storage_gathers_and_reports_errors(tmp_path):
    transports = [StorageTransport(str(tmp_path), "job", r, 3) for r in range(3)]
    muxes = [Mux(t) for t in transports]
    results: list[object] = [None] * 3

    def rank(r: int) -> None:
        results[r] = muxes[r].allgather(1, r * 10)
        muxes[r].allgather(2, r)  # a second collective right behind the first

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND_S)
    try:
        assert results == [[0, 10, 20]] * 3
        muxes[1].fail(3, 0, "boom")
        deadline = time.monotonic() + BOUND_S
        while muxes[2].failure(3) is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        failure = muxes[2].failure(3)
        assert failure is not None and failure.rank == 1 and failure.cause == "boom"
    finally:
        for m, t in zip(muxes, transports, strict=True):
            m.close()
            t.close()
