"""Received exchange data beyond a stage's memory budget goes to local Arrow IPC files.

Without this a stage holds all of its input in memory before DuckDB starts, and the rank is killed
where DuckDB alone would have spilled. Batches are kept in memory while the stage's inputs fit the
budget; past it, the exchange's batches (held and later ones) are written to one Arrow IPC file in
the rank's spill directory, and DuckDB scans the file as a memory-mapped Arrow dataset — pages the
kernel can drop, not anonymous memory. The files are removed when the stage ends, also on failure.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

# What a stage sees of one exchange input: in memory, or spilled and scanned from disk.
ExchangeInput = pa.Table | ds.Dataset

_names = itertools.count()


@dataclass
class StageSpill:
    """The memory budget of one stage's received inputs, and the files it spilled."""

    directory: Path | None  # None: never spill (no spill directory)
    budget_bytes: int
    held_bytes: int = 0
    spilled_bytes: int = 0
    files: list[Path] = field(default_factory=list)

    def sink(self, schema: pa.Schema) -> InputSink:
        return InputSink(self, schema)

    def remove_files(self) -> None:
        for f in self.files:
            f.unlink(missing_ok=True)
        self.files.clear()


@dataclass
class InputSink:
    """One exchange's received batches: held in memory until the stage's budget is used up."""

    spill: StageSpill
    schema: pa.Schema
    held: list[pa.RecordBatch] = field(default_factory=list)
    writer: pa.ipc.RecordBatchFileWriter | None = None
    path: Path | None = None

    def add(self, batches: list[pa.RecordBatch]) -> None:
        if self.writer is None:
            nbytes = sum(b.nbytes for b in batches)
            if self.spill.directory is None or self.spill.held_bytes + nbytes <= self.spill.budget_bytes:
                self.held.extend(batches)
                self.spill.held_bytes += nbytes
                return
            self._start_file()
        assert self.writer is not None
        for b in batches:
            self.writer.write_batch(b)
            self.spill.spilled_bytes += b.nbytes

    def _start_file(self) -> None:
        assert self.spill.directory is not None
        self.path = self.spill.directory / f"exchange-{next(_names)}.arrow"
        self.spill.files.append(self.path)
        self.writer = pa.ipc.new_file(str(self.path), self.schema)
        held, self.held = self.held, []
        self.spill.held_bytes -= sum(b.nbytes for b in held)
        for b in held:
            self.writer.write_batch(b)
            self.spill.spilled_bytes += b.nbytes

    def finish(self) -> ExchangeInput:
        if self.writer is None:
            return pa.Table.from_batches(self.held, schema=self.schema)
        self.writer.close()
        return ds.dataset(str(self.path), format="arrow", filesystem=pafs.LocalFileSystem(use_mmap=True))


def num_rows(data: ExchangeInput) -> int:
    return data.num_rows if isinstance(data, pa.Table) else data.count_rows()


def materialize(data: ExchangeInput) -> pa.Table:
    return data if isinstance(data, pa.Table) else data.to_table()
