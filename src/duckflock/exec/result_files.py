"""Writing a query's result to files as its batches come, instead of holding it as one table.

``--output FILE`` (.parquet, .csv, .arrow): the driver streams the result into one file.
``--output DIR/``: every rank writes its share of the final stage to ``part-<rank>-<seq>.parquet``
itself, with no gather; when the rows are range-partitioned by ORDER BY, reading the parts in name
order gives the sorted result. ``_SUCCESS`` marks a directory whose query completed.

Files are written under hidden temporary names and renamed when complete, so a failed query leaves
no partial file behind.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from duckflock.errors import DuckflockError
from duckflock.local_duckdb import check_exact_from_arrow

SUFFIXES = (".parquet", ".csv", ".arrow")
SUCCESS = "_SUCCESS"
# Parquet batches are collected into row groups of about this size: one row group per arriving
# chunk would make files larger and slower to read; this bounds what is held.
ROW_GROUP_BYTES = 64 << 20


def is_directory(output: str) -> bool:
    """``--output`` names a directory of part files: a trailing slash, or an existing directory."""
    return output.endswith(("/", os.sep)) or Path(output).is_dir()


def part_name(rank: int, seq: int = 0) -> str:
    # Zero-padded: name order is rank order, which is the sort order of a range-partitioned ORDER BY.
    return f"part-{rank:05d}-{seq:05d}.parquet"


def prepare_directory(path: str) -> Path:
    """Create the directory and remove what an earlier query wrote there (its parts and marker)."""
    target = Path(path)
    try:
        target.mkdir(parents=True, exist_ok=True)
        for old in [*target.glob("part-*.parquet"), target / SUCCESS]:
            old.unlink(missing_ok=True)
    except OSError as e:
        raise DuckflockError(f"cannot write into {target}: {e.strerror}") from None
    return target


def mark_complete(directory: Path) -> None:
    (directory / SUCCESS).touch()


class ResultWriter:
    """One result file, written batch by batch with the result's column names and types."""

    def __init__(self, path: str | Path, schema: pa.Schema, types: Sequence[str] = ()):
        """``types``: the result's DuckDB types (a Parquet or CSV file refuses those its Arrow
        form has lost values of; an Arrow file holds that form, as DuckDB's .arrow() gives it)."""
        self.target = Path(path)
        self.schema = schema
        suffix = self.target.suffix.lower()
        if suffix not in SUFFIXES:
            raise DuckflockError(f"--output must end in .parquet, .csv or .arrow, not {self.target.name!r}")
        if suffix != ".arrow":
            check_exact_from_arrow(schema.names, types, f"a {suffix[1:]} file")
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            name = f".{self.target.name}."
            fd, self.tmp = tempfile.mkstemp(dir=self.target.parent, prefix=name, suffix=".tmp")
        except OSError as e:
            raise DuckflockError(f"cannot write {self.target}: {e.strerror}") from None
        os.close(fd)
        self.rows = 0
        self._group: list[pa.RecordBatch] = []
        self._group_bytes = 0
        try:
            if suffix == ".parquet":
                self._writer = pq.ParquetWriter(self.tmp, schema)
            elif suffix == ".csv":
                self._writer = pacsv.CSVWriter(self.tmp, schema)
            else:
                self._writer = pa.ipc.new_file(self.tmp, schema)
        except pa.ArrowException as e:  # e.g. an INTERVAL column, which Arrow cannot put in Parquet
            Path(self.tmp).unlink(missing_ok=True)
            raise _cannot_write(suffix, e) from None

    def write(self, batch: pa.RecordBatch) -> None:
        """A batch of the final stage's output: its columns renamed and cast to the result's."""
        if batch.num_rows == 0:
            return
        if any(isinstance(f.type, pa.BaseExtensionType) for f in batch.schema):
            batch = _as_duckdb_default(batch)  # ranks exchange lossless types; files get DuckDB's defaults
        batch = pa.RecordBatch.from_arrays(batch.columns, names=self.schema.names)
        if not batch.schema.equals(self.schema):
            batch = batch.cast(self.schema)
        self.rows += batch.num_rows
        if not isinstance(self._writer, pq.ParquetWriter):
            try:
                self._writer.write_batch(batch)
            except pa.ArrowException as e:  # e.g. a BLOB that is not UTF-8, into a CSV file
                raise _cannot_write(self.target.suffix, e) from None
            return
        self._group.append(batch)
        self._group_bytes += batch.nbytes
        if self._group_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self._group:
            self._writer.write_table(pa.Table.from_batches(self._group), row_group_size=1 << 30)
            self._group, self._group_bytes = [], 0

    def write_table(self, table: pa.Table) -> None:
        for batch in table.to_batches():
            self.write(batch)

    def commit(self) -> None:
        if isinstance(self._writer, pq.ParquetWriter):
            self._flush()
        self._writer.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.tmp, 0o666 & ~umask)  # as any new file would be, not mkstemp's owner-only mode
        os.replace(self.tmp, self.target)

    def abort(self) -> None:
        try:
            self._writer.close()
        finally:
            Path(self.tmp).unlink(missing_ok=True)


def _cannot_write(suffix: str, e: pa.ArrowException) -> DuckflockError:
    return DuckflockError(f"the result cannot be written as {suffix}: {e}")


def _as_duckdb_default(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch with DuckDB's extension types (lossless exchange) in DuckDB's default Arrow types."""
    import duckdb

    from duckflock.local_duckdb import fetch_as_duckdb_returns

    con = duckdb.connect()
    try:
        con.execute("SET arrow_lossless_conversion = true")
        con.register("lossless_batch", pa.Table.from_batches([batch]))
        table = fetch_as_duckdb_returns(con, "SELECT * FROM lossless_batch", keep_order=True)
    finally:
        con.close()
    return table.combine_chunks().to_batches()[0]
