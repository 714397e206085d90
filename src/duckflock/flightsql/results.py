"""Results waiting for their client's DoGet: each for the caller that asked, fetched once, dropped
when left idle. A large one waits in an Arrow IPC file of the server's temp directory, not in
memory (a client may take its time, and several may wait at once); it is read back memory-mapped,
and the file is removed as soon as it is opened (the mapping stays readable until the stream ends).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.flight as flight

SPILL_BYTES = 64 << 20  # results larger than this wait on disk


@dataclass
class _Held:
    owner: str
    table: pa.Table | None  # in memory, or None: in ``path``
    path: str | None = None
    used: float = field(default_factory=time.monotonic)

    def discard(self) -> None:
        if self.path is not None:
            _remove(self.path)


class ResultStore:
    def __init__(self, idle_timeout_s: float, spill_bytes: int = SPILL_BYTES):
        self.idle_timeout_s = idle_timeout_s
        self.spill_bytes = spill_bytes
        self._lock = threading.Lock()
        self._held: dict[bytes, _Held] = {}
        self._dir: str | None = None  # made at the first spill

    def put(self, owner: str, table: pa.Table) -> bytes:
        """Hold ``table`` for ``owner``; the handle that names it."""
        held = _Held(owner, table)
        if table.nbytes > self.spill_bytes:
            held = _Held(owner, None, self._write(table))
        handle = secrets.token_bytes(16)
        with self._lock:
            self._drop_idle()
            self._held[handle] = held
        return handle

    def take(self, owner: str, handle: bytes) -> flight.RecordBatchStream:
        """The stream of the result ``handle`` names, which is then no longer held; KeyError where
        it is not held for ``owner``."""
        with self._lock:
            held = self._held.get(handle)
            if held is None or held.owner != owner:
                raise KeyError("no result for this ticket (fetched already, timed out, or not yours)")
            del self._held[handle]
        if held.table is not None:
            return flight.RecordBatchStream(held.table)
        assert held.path is not None
        try:
            reader = pa.ipc.open_file(pa.memory_map(held.path))
        finally:
            held.discard()
        return flight.RecordBatchStream(reader.read_all())  # zero-copy: batches on the mapping

    def drop(self, owner: str, handle: bytes) -> bool:
        """Forget the result ``handle`` names, if held for ``owner``; whether it was."""
        with self._lock:
            held = self._held.get(handle)
            if held is None or held.owner != owner:
                return False
            del self._held[handle]
        held.discard()
        return True

    def close(self) -> None:
        with self._lock:
            self._held.clear()
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def directory(self) -> str | None:
        """Where large results wait (made at the first)."""
        return self._dir

    @property
    def files(self) -> list[str]:
        """The files of the large results waiting now."""
        return sorted(os.listdir(self._dir)) if self._dir is not None else []

    def _write(self, table: pa.Table) -> str:
        with self._lock:
            if self._dir is None:
                self._dir = tempfile.mkdtemp(prefix="duckflock-serve-")
        fd, path = tempfile.mkstemp(suffix=".arrow", dir=self._dir)
        try:
            with os.fdopen(fd, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
                w.write_table(table)
        except BaseException:
            _remove(path)
            raise
        return path

    def _drop_idle(self) -> None:
        oldest = time.monotonic() - self.idle_timeout_s
        for handle in [h for h, held in self._held.items() if held.used < oldest]:
            self._held.pop(handle).discard()


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
