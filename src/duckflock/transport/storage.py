"""Storage exchange: ranks that share no network, only a directory or an object-store bucket
(the serverless exchange of Lambada and Modularis).

Messages travel inside write-once objects under ``<uri>/<job>/``:

- ``msg/<src>-<seq>[-<mask>]``: what ``src`` sent every rank since its previous flush, one block
  per destination (Lambada's and Modularis's write combining); on S3 ``mask`` names, in hex bits,
  the destinations that have a block. A sender buffers its messages and writes one object when they
  reach ``flush_bytes``, or as soon as its multiplexer hands it nothing more (the poll after a round
  of sends): a control message waits one round of the mux, not for a full buffer. At N ranks a
  round of all-to-all sends is N PUTs, not N² (a PUT costs 12.5 GETs on AWS, and request rates are
  limited per prefix).
- ``hb/<rank>-<n>``: the rank's heartbeat, renewed every HEARTBEAT_S, holding its progress (per
  source, the sequence number of the next object it will read); ``hb/<rank>-end`` once it has
  closed. A peer whose heartbeat has not changed for ``peer_timeout_s`` (by the reader's own clock:
  hosts' clocks may differ) is lost.

An object appears atomically: on a local or shared file system it is written under ``tmp/`` and
renamed; on S3 a PUT (or a multi-part upload's completion) is atomic. A receiver's thread takes
each source's objects in sequence order (a gap waits for its object), polling more often right
after traffic: on S3 it lists ``msg/`` (one LIST for all senders) and passes an object whose mask
leaves it out by name alone; on a file system it opens each source's next object by name. It reads
the index and then its own block (on S3 a HEAD and two ranged GETs; an object of at most
WHOLE_READ_BYTES in one GET) and hands the messages to the multiplexer. Only the sender deletes an
object, once every peer's heartbeat shows it has passed it (each receiver waits for every object of
a source in turn, so none may vanish before all have passed it): no agreement among readers, and
the progress rides on heartbeats written anyway, read only while objects wait for deletion. The
session's launcher removes the whole job directory at the end, with whatever a failed rank left.

Object layout: ``INDEX_MAGIC``, the rank count and per rank its block's (offset, length), (0, 0)
for none, as int64; then the blocks, each at a multiple of 64 bytes. A block: ``MAGIC``, an int64
word count, the words (message count; per message its tag, its part count or -1 for a single
buffer, and each part's length), then the parts, each starting at a multiple of 64 bytes so that
Arrow buffers rebuilt on them are aligned.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from duckflock.storage import objects
from duckflock.transport.base import Buffer, Inbox, SendHandle, Transport, view

HEARTBEAT_S = 1.0
# Peers' progress a rank reads per heartbeat, in turn, while its objects wait for deletion: at N
# ranks every peer's is read each ceil((N - 1) / PROGRESS_READS) beats, N * PROGRESS_READS GETs a
# beat over the job instead of N^2 (256 ranks: 65k GETs a second, past S3's rate per prefix).
# Deletion lags by as many beats (objects stay that much longer); none is deleted early.
PROGRESS_READS = 8
MAGIC = b"DFXCHG01"  # a block of messages
INDEX_MAGIC = b"DFXIDX01"  # a combined object: the index of its blocks
# An object up to this size is read whole, in one GET, rather than its index and then its block:
# at S3's ~20-50 ms a request, reading 256 KiB more costs less than a second request.
WHOLE_READ_BYTES = 256 << 10
_ALIGN = 64
_ZEROS = bytes(_ALIGN)
# How often a receiver lists its prefix: right after traffic the first, growing with the quiet
# time to the second (a listing of a local directory costs about 50 us; an S3 LIST a request).
LOCAL_POLL_S = (0.0005, 0.02)
REMOTE_POLL_S = (0.01, 0.25)


def open_location(location: str | tuple[Any, str]) -> tuple[pafs.FileSystem, str]:
    """A filesystem and root path: from a URI or path (``/dir``, ``file:///dir``: pyarrow's
    ``FileSystem.from_uri``; ``s3://bucket/p``: storage/objects.py's S3 filesystem, so the exchange
    uses the endpoint, region, credentials, timeouts and retries tables on S3 use), or a
    (filesystem, root) pair where the filesystem is a pyarrow one or an fsspec one."""
    if isinstance(location, tuple):
        fs, root = location
        if not isinstance(fs, pafs.FileSystem):  # fsspec: adapted by pyarrow's handler
            fs = pafs.PyFileSystem(pafs.FSSpecHandler(fs))
        return fs, root.rstrip("/")
    if objects.is_uri(location):
        bucket, key = objects.split(location)
        if not bucket:
            raise OSError(f"{location} names no bucket")
        return objects.filesystem(delayed_open=True), f"{bucket}/{key}".rstrip("/")
    if "://" not in location:
        location = os.path.abspath(location)
    fs, root = pafs.FileSystem.from_uri(location)
    return fs, root.rstrip("/")


class ObjectStore:
    """Write-once objects on a pyarrow filesystem: put (atomically), list, read ranges, delete."""

    def __init__(self, fs: pafs.FileSystem, root: str):
        self.fs, self.root = fs, root
        self.local = isinstance(fs, pafs.LocalFileSystem)

    def path(self, *names: str) -> str:
        return "/".join((self.root, *names))

    def make_dirs(self, *names: str) -> None:
        """Directories exist only on file systems; an object store has prefixes."""
        if self.local:
            for name in names:
                os.makedirs(self.path(name), exist_ok=True)

    def put(self, name: str, parts: list[Buffer]) -> None:
        if not self.local:
            with self.fs.open_output_stream(self.path(name)) as out:
                for part in parts:
                    out.write(part)
            return
        # A rename within the file system makes the whole object appear at once.
        tmp = self.path("tmp", uuid.uuid4().hex)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            views = [view(p).cast("B") for p in parts]
            while views:  # writev writes at most IOV_MAX buffers, and may write part of them
                written = os.writev(fd, views[:1024])
                while views and written >= views[0].nbytes:
                    written -= views[0].nbytes
                    views.pop(0)
                if views and written:
                    views[0] = views[0][written:]
        finally:
            os.close(fd)
        os.rename(tmp, self.path(name))

    def list(self, prefix: str) -> list[str]:
        if self.local:
            try:
                return os.listdir(self.path(prefix))
            except FileNotFoundError:
                return []
        infos = self.fs.get_file_info(pafs.FileSelector(self.path(prefix), allow_not_found=True))
        return [i.base_name for i in infos]

    def open(self, name: str) -> pa.NativeFile:
        """An object to read ranges of: on a file system mapped (its slices are not copies, and the
        mapping outlives the file's deletion); on S3 opening is a HEAD (pyarrow's Python API takes
        no size from a listing) and each read a ranged GET."""
        if self.local:
            return pa.memory_map(self.path(name))
        return self.fs.open_input_file(self.path(name))

    def get(self, name: str) -> pa.Buffer:
        with self.open(name) as f:
            return f.read_buffer()

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self.path(name))

    def delete_all(self) -> None:
        """The root and everything under it, if it exists."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_dir(self.root)
        if not self.local:
            # So that the exchange prefix is left as empty as it was found.
            objects.drop_empty_markers(self.fs, self.root.rpartition("/")[0])


def remove_job(location: str | tuple[Any, str], job: str) -> None:
    """Remove every object of ``job`` (its launcher calls this when the session ends)."""
    fs, root = open_location(location)
    ObjectStore(fs, f"{root}/{job}").delete_all()


def stale_jobs(location: str, older_than_s: float, now: float) -> list[str]:
    """The jobs under an exchange location whose every object is older than ``older_than_s``: a
    running job renews its heartbeat each HEARTBEAT_S, so these were left by a launcher that was
    killed before it could remove them (``remove_job``)."""
    fs, root = open_location(location)
    found = []
    for job in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
        if job.type != pafs.FileType.Directory:
            continue
        under = fs.get_file_info(pafs.FileSelector(job.path, recursive=True))
        if not any(i.base_name == "hb" for i in under):
            continue  # not an exchange job's
        newest = max((i.mtime.timestamp() for i in under if i.mtime is not None), default=0.0)
        if now - newest >= older_than_s:
            found.append(job.base_name)
    return found


def encode(messages: list[tuple[int, Buffer]]) -> list[Buffer]:
    """The parts of one object holding ``messages`` (tag, payload or list of payload parts)."""
    words: list[int] = [len(messages)]
    body: list[Buffer] = []
    for tag, data in messages:
        parts = data if isinstance(data, list) else [data]
        sizes = [view(p).nbytes for p in parts]
        words += [tag, len(parts) if isinstance(data, list) else -1, *sizes]
        for part, size in zip(parts, sizes, strict=True):
            body.append(part)
            if size % _ALIGN:
                body.append(_ZEROS[: _ALIGN - size % _ALIGN])
    header = MAGIC + np.array([len(words), *words], dtype="<i8").tobytes()
    return [header, _ZEROS[: -len(header) % _ALIGN], *body]


def decode(obj: pa.Buffer) -> list[tuple[int, object]]:
    """The (tag, payload) messages of an object; payloads are slices of it (not copies)."""
    if obj.size < 16 or obj.slice(0, len(MAGIC)).to_pybytes() != MAGIC:
        raise ValueError("not an exchange object")
    n = int(np.frombuffer(obj, dtype="<i8", count=1, offset=len(MAGIC))[0])
    words = np.frombuffer(obj, dtype="<i8", count=n, offset=len(MAGIC) + 8).tolist()
    offset = len(MAGIC) + 8 * (n + 1)
    offset += -offset % _ALIGN
    out: list[tuple[int, object]] = []
    i = 1
    for _ in range(words[0]):
        tag, count = words[i], words[i + 1]
        sizes = words[i + 2 : i + 2 + max(count, 1)]
        i += 2 + len(sizes)
        parts = []
        for size in sizes:
            parts.append(obj.slice(offset, size))
            offset += size + (-size % _ALIGN)
        out.append((tag, parts if count >= 0 else parts[0]))
    return out


def combine(blocks: dict[int, list[tuple[int, Buffer]]], ranks: int) -> list[Buffer]:
    """The parts of one object holding a block of messages (``encode``) for each destination in
    ``blocks``, behind an index of every rank's (offset, length), (0, 0) for no block."""
    index = np.zeros((ranks, 2), dtype="<i8")
    body: list[Buffer] = []
    offset = _aligned(index_bytes(ranks))
    for dest, messages in sorted(blocks.items()):
        parts = encode(messages)
        length = sum(view(p).nbytes for p in parts)  # a multiple of 64: encode pads every part
        index[dest] = (offset, length)
        body += parts
        offset += length
    header = INDEX_MAGIC + np.array([ranks], dtype="<i8").tobytes() + index.tobytes()
    return [header, _ZEROS[: -len(header) % _ALIGN], *body]


def index_bytes(ranks: int) -> int:
    return len(INDEX_MAGIC) + 8 + 16 * ranks


def _aligned(n: int) -> int:
    return n + -n % _ALIGN


def read_messages(f: pa.NativeFile, dest: int, ranks: int) -> list[tuple[int, object]]:
    """``dest``'s messages in a combined object: on S3 a ranged GET of the index, then one of its
    block; a small object (``WHOLE_READ_BYTES``) in one GET instead."""
    size = f.size()
    whole = _read_at(f, 0, size) if size <= WHOLE_READ_BYTES else None
    header = whole if whole is not None else _read_at(f, 0, index_bytes(ranks))
    if header.size < index_bytes(ranks) or header.slice(0, len(INDEX_MAGIC)).to_pybytes() != INDEX_MAGIC:
        raise ValueError("not an exchange object")
    words = np.frombuffer(header, dtype="<i8", count=1 + 2 * ranks, offset=len(INDEX_MAGIC)).tolist()
    if words[0] != ranks:
        raise ValueError(f"an exchange object of {words[0]} ranks, read by one of {ranks}")
    offset, length = words[1 + 2 * dest : 3 + 2 * dest]
    if not length:
        return []
    return decode(whole.slice(offset, length) if whole is not None else _read_at(f, offset, length))


def _read_at(f: pa.NativeFile, offset: int, length: int) -> pa.Buffer:
    """A range as a buffer (``read_at`` copies into ``bytes``); of a mapped file, not a copy."""
    f.seek(offset)
    return f.read_buffer(length)


class _Written(SendHandle):
    __slots__ = ("_done",)

    def __init__(self) -> None:
        self._done = False

    def done(self) -> bool:
        return self._done


class StorageTransport(Transport):
    name = "storage"
    multipart = True

    def __init__(
        self,
        location: str | tuple[Any, str],
        job: str,
        rank: int,
        size: int,
        peer_timeout_s: float = 30.0,
        flush_bytes: int = objects.WRITE_BYTES,
        poll_s: tuple[float, float] | None = None,
    ):
        fs, root = open_location(location)
        self.where = location if isinstance(location, str) else root
        self.store = ObjectStore(fs, f"{root}/{job}")
        self.rank, self.size = rank, size
        self.flush_bytes = flush_bytes
        self.timeout = peer_timeout_s
        self.poll_s = poll_s or (LOCAL_POLL_S if self.store.local else REMOTE_POLL_S)
        self.store.make_dirs("tmp", "hb", "msg")
        self.failed: str | None = None
        # Outgoing, touched by the multiplexer thread only: messages not flushed yet, per target.
        self._pending: dict[int, list[tuple[int, Buffer, _Written]]] = {}
        self._pending_bytes = 0
        self._seq = 0  # the next object's sequence number
        self._sent_since_poll = False
        self._writes: queue.SimpleQueue = queue.SimpleQueue()
        # This rank's objects written and not deleted yet, (seq, name) in order; then deleted.
        self._written: collections.deque[tuple[int, str]] = collections.deque()
        self._deletes: queue.SimpleQueue = queue.SimpleQueue()
        # Per source, the sequence number of the next object to read: this rank's progress, which
        # its heartbeat publishes so that senders may delete what every rank has passed.
        self._expected = [0] * size
        self._inbox = Inbox()
        self._stop = threading.Event()
        self._sent = threading.Event()  # a send: a reply is likely soon, so poll often again
        now = time.monotonic()
        self._heard = dict.fromkeys(range(size), now)
        self._beats: dict[int, int] = {}
        self._ended: set[int] = set()
        self._passed = [0] * size  # per peer, how far it has read this rank's objects
        self._progress_read: dict[int, str] = {}  # per peer, the heartbeat its progress came from
        self._next_reader = 0  # the peer whose progress is read first at the next beat
        self.progress_gets = 0  # heartbeats read for peers' progress (their count, for tests)
        loops = {
            "write": self._write_loop,
            "read": self._read_loop,
            "delete": self._delete_loop,
            "beat": self._beat_loop,
        }
        self._threads = [
            threading.Thread(target=self._guarded, args=(fn,), name=f"duckflock-storage-{what}", daemon=True)
            for what, fn in loops.items()
        ]
        for t in self._threads:
            t.start()

    # ---- sending ---------------------------------------------------------------------------------
    def isend(self, dest: int, tag: int, data) -> SendHandle:
        handle = _Written()
        n = sum(view(d).nbytes for d in data) if isinstance(data, list) else view(data).nbytes
        self._pending.setdefault(dest, []).append((tag, data, handle))
        self._pending_bytes += n
        self._sent_since_poll = True
        if self._pending_bytes >= self.flush_bytes:
            self._flush()
        self._sent.set()
        return handle

    def _flush(self) -> None:
        """One object with a block for each destination that has messages waiting."""
        if not self._pending:
            return
        pending, self._pending, self._pending_bytes = self._pending, {}, 0
        name = f"msg/{self.rank}-{self._seq:012d}"
        if not self.store.local:  # the receivers with a block: the others need not read it
            name += f"-{sum(1 << dest for dest in pending):x}"
        blocks = {dest: [(tag, data) for tag, data, _ in ms] for dest, ms in pending.items()}
        self._writes.put((self._seq, name, blocks, [h for ms in pending.values() for *_, h in ms]))
        self._seq += 1

    def _write_loop(self) -> None:
        while True:
            item = self._writes.get()
            if item is None:
                return
            seq, name, blocks, handles = item
            self.store.put(name, combine(blocks, self.size))
            self._written.append((seq, name))
            for h in handles:
                h._done = True

    def _delete_loop(self) -> None:
        """Delete the objects every peer has passed, off the heartbeat loop: on S3 a delete is three
        requests (pyarrow checks the object, deletes it and keeps its "directory" with a marker)."""
        while (name := self._deletes.get()) is not None:
            self.store.delete(name)

    # ---- receiving -------------------------------------------------------------------------------
    def poll(self) -> list[tuple[int, int, object]]:
        # The multiplexer handed nothing since its last poll: it has no more to send for now.
        if not self._sent_since_poll:
            self._flush()
        self._sent_since_poll = False
        return self._inbox.drain()

    def busy(self) -> bool:
        return bool(self._pending)

    def set_waker(self, wake: Callable[[], None]) -> bool:
        self._inbox.wake = wake
        return True

    def _read_loop(self) -> None:
        last = time.monotonic()
        low, high = self.poll_s
        while not self._stop.is_set():
            if self._receive() or self._sent.is_set():
                last = time.monotonic()
            self._sent.clear()
            self._sent.wait(min(high, max(low, (time.monotonic() - last) / 8)))

    def _receive(self) -> bool:
        """Read this rank's blocks of the objects next in their source's sequence; pass, by name
        alone, the objects holding none."""
        # On S3 a LIST finds what is there (its objects by "<src>-<seq>"), each missing object
        # tried would be a request; on a file system a failed open costs microseconds, where a
        # listing would also return every object passed but not deleted yet.
        listed = None if self.store.local else {n.rpartition("-")[0]: n for n in self.store.list("msg")}
        got = False
        expected = self._expected
        for src in range(self.size):
            while src != self.rank:
                key = f"{src}-{expected[src]:012d}"
                if listed is None:
                    try:
                        f = self.store.open(f"msg/{key}")
                    except FileNotFoundError:
                        break
                elif (name := listed.get(key)) is None:
                    break
                elif int(name.rpartition("-")[2], 16) >> self.rank & 1:
                    f = self.store.open(f"msg/{name}")
                else:  # no block for this rank
                    expected[src] += 1
                    continue
                with f:
                    for tag, payload in read_messages(f, self.rank, self.size):
                        self._inbox.put((src, tag, payload))
                        got = True
                expected[src] += 1
        return got

    # ---- liveness and deletion -------------------------------------------------------------------
    def _progress(self) -> bytes:
        return np.array(self._expected, dtype="<i8").tobytes()

    def _beat_loop(self) -> None:
        n = 0
        try:
            while True:
                self.store.put(f"hb/{self.rank}-{n}", [self._progress()])
                if n:
                    self.store.delete(f"hb/{self.rank}-{n - 1}")
                n += 1
                now = time.monotonic()
                latest: dict[int, str] = {}  # per peer, its newest heartbeat
                for name in sorted(self.store.list("hb")):
                    peer, _, beat = name.partition("-")
                    if not peer.isdigit():
                        continue
                    if beat == "end":
                        self._ended.add(int(peer))
                        latest[int(peer)] = name
                    elif beat.isdigit() and int(beat) > self._beats.get(int(peer), -1):
                        self._beats[int(peer)] = int(beat)
                        self._heard[int(peer)] = now
                        if int(peer) not in self._ended:
                            latest[int(peer)] = name
                self._delete_passed(latest)
                if self._stop.wait(HEARTBEAT_S):
                    self.store.delete(f"hb/{self.rank}-{n - 1}")
                    return
        finally:
            self._deletes.put(None)  # the delete loop ends once it has deleted all it was given

    def _delete_passed(self, latest: dict[int, str]) -> None:
        """Hand the delete loop this rank's objects that every peer has read or passed (a peer
        waits for each object in sequence, so none may go before all have passed it), learning
        how far each peer is from its newest heartbeat: read only while objects wait."""
        if not self._written:
            return
        read = self._progress_read
        due = [p for p, name in sorted(latest.items()) if p != self.rank and read.get(p) != name]
        # In turn from where the last beat stopped: each peer's progress is read within a few beats.
        turn = [p for p in due if p >= self._next_reader] + [p for p in due if p < self._next_reader]
        for peer in turn[:PROGRESS_READS]:
            self._next_reader = peer + 1
            name = latest[peer]
            self.progress_gets += 1
            try:
                progress = self.store.get(f"hb/{name}")
            except OSError:  # replaced by the peer's next heartbeat meanwhile: read that next time
                continue
            if progress.size == 8 * self.size:
                self._passed[peer] = int(np.frombuffer(progress, dtype="<i8")[self.rank])
                self._progress_read[peer] = name
        passed = min((p for peer, p in enumerate(self._passed) if peer != self.rank), default=self._seq)
        while self._written and self._written[0][0] < passed:
            self._deletes.put(self._written.popleft()[1])

    def _guarded(self, loop: Callable[[], None]) -> None:
        try:
            loop()
        except Exception as e:  # the medium failed under us: fail the session, saying where
            self.failed = f"rank {self.rank} lost the exchange storage at {self.where}: {e}"
            self._inbox.wake()

    def peer_failure(self) -> str | None:
        if self.failed:
            return self.failed
        now = time.monotonic()
        for peer, heard in self._heard.items():
            if peer != self.rank and peer not in self._ended and now - heard > self.timeout:
                return (
                    f"rank {peer} wrote no heartbeat to the exchange storage at {self.where} "
                    f"for {self.timeout:.0f} s: it is lost"
                )
        return None

    def close(self) -> None:
        self._stop.set()
        self._sent.set()
        self._writes.put(None)
        for t in self._threads:
            t.join(timeout=10)
        if self.failed is None:
            with contextlib.suppress(OSError):  # the job may be removed already (its launcher ended)
                self.store.put(f"hb/{self.rank}-end", [self._progress()])
