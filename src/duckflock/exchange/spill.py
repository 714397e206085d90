"""Received exchange data beyond a query's memory budget goes to local Arrow IPC files.

Without this a rank holds all of a stage's input in memory before DuckDB starts, and is killed
where DuckDB alone would have spilled. Batches are kept in memory while the query's received inputs
fit the budget; past it, an exchange's batches (held and later ones) are written to one Arrow IPC
file in the rank's spill directory, and DuckDB scans a table memory-mapped from the file — pages
the kernel can drop, not anonymous memory, and a table whose row count DuckDB's optimizer sees
(it picks the smaller join side to build on). The files are removed when the query ends, also
on failure.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

_names = itertools.count()


@dataclass
class QuerySpill:
    """The memory budget of one query's received inputs on a rank (exchanges are received in
    parallel, each in its own thread), and the files they spilled."""

    directory: Path | None  # None: never spill (no spill directory)
    budget_bytes: int
    held_bytes: int = 0
    files: list[Path] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sink(self, schema: pa.Schema) -> InputSink:
        return InputSink(self, schema)

    def reserve(self, nbytes: int) -> bool:
        """Count ``nbytes`` as held in memory, if they fit the budget."""
        with self.lock:
            if self.directory is not None and self.held_bytes + nbytes > self.budget_bytes:
                return False
            self.held_bytes += nbytes
            return True

    def release(self, nbytes: int) -> None:
        with self.lock:
            self.held_bytes -= nbytes

    def remove_files(self) -> None:
        with self.lock:
            for f in self.files:
                f.unlink(missing_ok=True)
            self.files.clear()


@dataclass
class InputSink:
    """One exchange's received batches: held in memory until the stage's budget is used up."""

    spill: QuerySpill
    schema: pa.Schema
    held: list[pa.RecordBatch] = field(default_factory=list)
    writer: pa.ipc.RecordBatchFileWriter | None = None
    path: Path | None = None
    held_bytes: int = 0  # counted against the query's budget
    spilled_bytes: int = 0  # written to the file

    def add(self, batches: list[pa.RecordBatch]) -> None:
        if self.writer is None:
            nbytes = sum(b.nbytes for b in batches)
            if self.spill.reserve(nbytes):
                self.held.extend(batches)
                self.held_bytes += nbytes
                return
            self._start_file()
        assert self.writer is not None
        for b in batches:
            self.writer.write_batch(b)
        self.spilled_bytes += sum(b.nbytes for b in batches)

    def _start_file(self) -> None:
        assert self.spill.directory is not None
        self.path = self.spill.directory / f"exchange-{next(_names)}.arrow"
        with self.spill.lock:
            self.spill.files.append(self.path)
        self.writer = pa.ipc.new_file(str(self.path), self.schema)
        held, self.held = self.held, []
        for b in held:
            self.writer.write_batch(b)
        nbytes, self.held_bytes = self.held_bytes, 0
        self.spill.release(nbytes)
        self.spilled_bytes += nbytes

    def finish(self) -> pa.Table:
        """The exchange's rows: in memory, or a table memory-mapped from the spill file."""
        if self.writer is None:
            return pa.Table.from_batches(self.held, schema=self.schema)
        self.writer.close()
        # Zero-copy: the table's buffers are the mapped file (written uncompressed).
        return pa.ipc.open_file(pa.memory_map(str(self.path))).read_all()
