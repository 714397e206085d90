"""Storage exchange: ranks that share no network, only a directory or an object-store bucket
(the serverless exchange of Lambada and Modularis).

Messages travel inside write-once objects under ``<uri>/<job>/``:

- ``to-<dest>/<src>-<seq>``: what ``src`` sent ``dest`` since its previous flush, in order. A sender
  buffers per destination and writes one object per (destination, flush) — write combining — when a
  destination holds ``flush_bytes``, or as soon as its multiplexer hands it nothing more (the poll
  after a round of sends): a control message waits one round of the mux, not for a full buffer.
  One object per (sender, receiver) rather than one per sender holding every receiver's block:
  a receiver then lists only its own prefix, reads each object whole (one GET, no index to read
  first) and deletes it once read without agreeing with other readers; an object per sender saves
  PUTs only where a sender has a little for each of very many receivers (Lambada's thousands of
  functions), not at the tens of ranks a session runs.
- ``hb/<rank>-<n>``: the rank's heartbeat, renewed every HEARTBEAT_S; ``hb/<rank>-end`` once it has
  closed. A peer whose heartbeat has not changed for ``peer_timeout_s`` (by the reader's own clock:
  hosts' clocks may differ) is lost.

An object appears atomically: on a local or shared file system it is written under ``tmp/`` and
renamed; on S3 a PUT (or a multi-part upload's completion) is atomic. A receiver's thread lists its
prefix, polling more often right after traffic, reads each source's objects in sequence order (a
gap waits for its object) and hands the messages to the multiplexer; another thread deletes each
object read. The session's launcher removes the whole job directory at the end.

Object layout: ``MAGIC``, an int64 word count, the words (message count; per message its tag, its
part count or -1 for a single buffer, and each part's length), then the parts, each starting at a
multiple of 64 bytes so that Arrow buffers rebuilt on them are aligned.
"""

from __future__ import annotations

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

FLUSH_BYTES = 8 << 20
HEARTBEAT_S = 1.0
MAGIC = b"DFXCHG01"
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
    """Write-once objects on a pyarrow filesystem: put (atomically), list, get, delete."""

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

    def get(self, name: str) -> pa.Buffer:
        if self.local:  # mapped, not copied: the mapping outlives the file's deletion
            with pa.memory_map(self.path(name)) as f:
                return f.read_buffer()
        with self.fs.open_input_stream(self.path(name)) as f:
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
        flush_bytes: int = FLUSH_BYTES,
        poll_s: tuple[float, float] | None = None,
    ):
        fs, root = open_location(location)
        self.where = location if isinstance(location, str) else root
        self.store = ObjectStore(fs, f"{root}/{job}")
        self.rank, self.size = rank, size
        self.flush_bytes = flush_bytes
        self.timeout = peer_timeout_s
        self.poll_s = poll_s or (LOCAL_POLL_S if self.store.local else REMOTE_POLL_S)
        self.store.make_dirs("tmp", "hb", *(f"to-{d}" for d in range(size)))
        self.failed: str | None = None
        # Outgoing, touched by the multiplexer thread only: messages not flushed yet, per target.
        self._pending: dict[int, list[tuple[int, Buffer, _Written]]] = {}
        self._pending_bytes: dict[int, int] = {}
        self._seq = [0] * size
        self._sent_since_poll = False
        self._writes: queue.SimpleQueue = queue.SimpleQueue()
        self._deletes: queue.SimpleQueue = queue.SimpleQueue()  # objects read, for the delete loop
        self._inbox = Inbox()
        self._stop = threading.Event()
        self._sent = threading.Event()  # a send: a reply is likely soon, so poll often again
        now = time.monotonic()
        self._heard = dict.fromkeys(range(size), now)
        self._beats: dict[int, int] = {}
        self._ended: set[int] = set()
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
        self._pending_bytes[dest] = self._pending_bytes.get(dest, 0) + n
        self._sent_since_poll = True
        if self._pending_bytes[dest] >= self.flush_bytes:
            self._flush(dest)
        self._sent.set()
        return handle

    def _flush(self, dest: int) -> None:
        messages = self._pending.pop(dest, [])
        self._pending_bytes.pop(dest, None)
        if messages:
            name = f"to-{dest}/{self.rank}-{self._seq[dest]:012d}"
            self._seq[dest] += 1
            self._writes.put((name, [(tag, data) for tag, data, _ in messages], [h for *_, h in messages]))

    def _write_loop(self) -> None:
        while True:
            item = self._writes.get()
            if item is None:
                return
            name, messages, handles = item
            self.store.put(name, encode(messages))
            for h in handles:
                h._done = True

    # ---- receiving -------------------------------------------------------------------------------
    def poll(self) -> list[tuple[int, int, object]]:
        # The multiplexer handed nothing since its last poll: it has no more to send for now.
        if not self._sent_since_poll:
            for dest in list(self._pending):
                self._flush(dest)
        self._sent_since_poll = False
        return self._inbox.drain()

    def busy(self) -> bool:
        return bool(self._pending)

    def set_waker(self, wake: Callable[[], None]) -> bool:
        self._inbox.wake = wake
        return True

    def _read_loop(self) -> None:
        expected = [0] * self.size  # the next sequence number of each source
        last = time.monotonic()
        low, high = self.poll_s
        try:
            while not self._stop.is_set():
                if self._receive(expected) or self._sent.is_set():
                    last = time.monotonic()
                self._sent.clear()
                self._sent.wait(min(high, max(low, (time.monotonic() - last) / 8)))
        finally:
            self._deletes.put(None)  # the delete loop ends once it has deleted all that was read

    def _delete_loop(self) -> None:
        """Delete each object once read, off the read loop: on S3 a delete is three requests
        (pyarrow checks the object, deletes it and keeps its "directory" with a marker), which
        would otherwise delay the next object's read."""
        while (name := self._deletes.get()) is not None:
            self.store.delete(name)

    def _receive(self, expected: list[int]) -> bool:
        """Read the objects addressed to this rank that are next in their source's sequence."""
        ready: set[tuple[int, int]] = set()
        for name in self.store.list(f"to-{self.rank}"):
            sender, _, seq = name.partition("-")
            if sender.isdigit() and seq.isdigit():
                ready.add((int(sender), int(seq)))
        got = False
        for src in range(self.size):
            while (src, expected[src]) in ready:
                name = f"to-{self.rank}/{src}-{expected[src]:012d}"
                for tag, payload in decode(self.store.get(name)):
                    self._inbox.put((src, tag, payload))
                self._deletes.put(name)
                expected[src] += 1
                got = True
        return got

    # ---- liveness --------------------------------------------------------------------------------
    def _beat_loop(self) -> None:
        n = 0
        while True:
            self.store.put(f"hb/{self.rank}-{n}", [])
            if n:
                self.store.delete(f"hb/{self.rank}-{n - 1}")
            n += 1
            now = time.monotonic()
            for name in self.store.list("hb"):
                peer, _, beat = name.partition("-")
                if not peer.isdigit():
                    continue
                if beat == "end":
                    self._ended.add(int(peer))
                elif beat.isdigit() and int(beat) > self._beats.get(int(peer), -1):
                    self._beats[int(peer)] = int(beat)
                    self._heard[int(peer)] = now
            if self._stop.wait(HEARTBEAT_S):
                self.store.delete(f"hb/{self.rank}-{n - 1}")
                return

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
                self.store.put(f"hb/{self.rank}-end", [])
