"""Writing a query's result to files as its batches come, instead of holding it as one table.

``--output FILE`` (.parquet, .csv, .arrow): the driver streams the result into one file.
``--output DIR/``: every rank writes its share of the final stage to ``part-<rank>-<seq>.parquet``
itself, with no gather; when the rows are range-partitioned by ORDER BY, reading the parts in name
order gives the sorted result. ``_SUCCESS`` marks a directory whose query completed.

Files are written under hidden temporary names and renamed when complete, so a failed query leaves
no partial file behind (in a directory, the complete parts of ranks that had finished stay, and no
``_SUCCESS``).

An ``s3://bucket/prefix/`` directory or ``s3://bucket/x.parquet`` file (storage/objects.py): each
file is written locally as above and uploaded whole when complete (an object appears whole or not
at all), and ``_SUCCESS`` is put last. A failed query puts no ``_SUCCESS``.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from duckflock.errors import DuckflockError
from duckflock.exec.results.duckdb_copy import DuckdbCopy
from duckflock.storage import objects

SUFFIXES = (".parquet", ".csv", ".arrow")
SUCCESS = "_SUCCESS"
TEMP_SUFFIX = ".tmp"  # of a file being written, hidden (a leading dot) until it is complete
# A part (part_name) or the temporary file of one being written (ResultWriter; mkstemp's own
# characters between the name and the suffix).
_OURS = re.compile(r"part-\d{5}-\d{5}\.parquet|\.part-\d{5}-\d{5}\.parquet\.\w+" + re.escape(TEMP_SUFFIX))


def is_directory(output: str) -> bool:
    """``--output`` names a directory of part files: a trailing slash, or an existing directory."""
    return output.endswith(("/", os.sep)) or Path(output).is_dir()


def part_name(rank: int, seq: int = 0) -> str:
    # Zero-padded: name order is rank order, which is the sort order of a range-partitioned ORDER BY.
    return f"part-{rank:05d}-{seq:05d}.parquet"


def prepare_directory(path: str) -> Path:
    """Create the directory and remove what an earlier query wrote there (its parts, marker and the
    temporary files of one that was killed); refuse one that holds anything else, which reading
    the directory back would mix into the result."""
    uri = objects.uri_of(path)
    if uri is not None:
        return _prepare_objects(uri.rstrip("/") + "/")
    target = Path(path)
    try:
        target.mkdir(parents=True, exist_ok=True)
        # Only names part_name() gives: a Spark job's or a table's own part-*.parquet are others.
        ours = {f for f in target.iterdir() if _OURS.fullmatch(f.name)} | {target / SUCCESS}
        # Hidden files (an NFS client's .nfs*, another tool's) are no part of a reader's result.
        others = sorted(f.name for f in target.iterdir() if f not in ours and not f.name.startswith("."))
        if others:
            raise DuckflockError(
                f"--output directory {target} holds other files ({', '.join(others[:3])}"
                f"{', ...' if len(others) > 3 else ''}): name an empty or new directory"
            )
        for old in ours:
            old.unlink(missing_ok=True)
    except OSError as e:
        raise DuckflockError(f"cannot write into {target}: {e.strerror}") from None
    return target


def mark_complete(directory: Path) -> None:
    uri = objects.uri_of(directory)
    if uri is not None:
        objects.put_bytes(f"{uri.rstrip('/')}/{SUCCESS}", b"")
    else:
        (directory / SUCCESS).touch()


class _ObjectDir(type(Path())):  # type: ignore[misc]
    """An output prefix passed on as a path (the driver resolves and joins it): resolving keeps it.
    Its text is Path's, ``s3:/bucket/prefix``, which ``objects.uri_of`` reads back."""

    def resolve(self, strict: bool = False) -> _ObjectDir:
        return self


def _prepare_objects(prefix: str) -> Path:
    """As prepare_directory, for a prefix of objects: the marker first, then earlier parts go."""
    names = objects.names_under(prefix)
    others = sorted(n for n in names if n != SUCCESS and not _OURS.fullmatch(n) and not n.startswith("."))
    if others:
        raise DuckflockError(
            f"--output {prefix} holds other objects ({', '.join(others[:3])}"
            f"{', ...' if len(others) > 3 else ''}): name an empty or new prefix"
        )
    for name in sorted(names, key=lambda n: n != SUCCESS):  # a reader stops trusting it at once
        objects.delete(prefix + name)
    return _ObjectDir(prefix)


class ResultWriter:
    """One result file, written batch by batch with the result's column names and types: Parquet
    and CSV by DuckDB's COPY (exec/results/duckdb_copy.py), Arrow IPC as DuckDB's .arrow() gives it."""

    def __init__(
        self,
        path: str | Path,
        schema: pa.Schema,
        types: Sequence[str],
        threads: int = 1,
        temp_dir: Path | None = None,
        time_zone: str = "",
        memory_bytes: int = 0,
    ):
        """``schema``: the result's as DuckDB's .arrow() gives it; ``types``: its DuckDB types.
        ``threads``, ``temp_dir`` (its spill files), ``time_zone`` (the session's) and
        ``memory_bytes`` (its memory_limit; 0: DuckDB's default): of the DuckDB writing Parquet or CSV."""
        # An object is written here first, in a directory of its own, and uploaded on commit.
        self.upload_to = objects.uri_of(path)
        self._local_dir: str | None = None
        if self.upload_to is not None:
            self._local_dir = tempfile.mkdtemp(prefix="result-", dir=temp_dir)
            path = Path(self._local_dir) / self.upload_to.rsplit("/", 1)[-1]
        self.target = Path(path)
        self.schema = schema
        suffix = self.target.suffix.lower()
        if suffix not in SUFFIXES:
            raise DuckflockError(f"--output must end in .parquet, .csv or .arrow, not {self.target.name!r}")
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            name = f".{self.target.name}."
            for stale in self.target.parent.glob(f"{name}*{TEMP_SUFFIX}"):  # of a killed query
                stale.unlink(missing_ok=True)
            fd, self.tmp = tempfile.mkstemp(dir=self.target.parent, prefix=name, suffix=TEMP_SUFFIX)
        except OSError as e:
            raise DuckflockError(f"cannot write {self.target}: {e.strerror}") from None
        os.close(fd)
        self.rows = 0
        self._writer: DuckdbCopy | pa.ipc.RecordBatchFileWriter
        if suffix != ".arrow":
            how = (threads, temp_dir, time_zone, memory_bytes)
            try:
                self._writer = DuckdbCopy(self.tmp, suffix[1:], schema.names, types, *how)
            except BaseException:
                Path(self.tmp).unlink(missing_ok=True)
                raise
            return
        try:
            self._writer = pa.ipc.new_file(self.tmp, schema)
        except pa.ArrowException as e:
            Path(self.tmp).unlink(missing_ok=True)
            raise _cannot_write(suffix, e) from None

    def write(self, batch: pa.RecordBatch) -> None:
        """A batch of the final stage's output (columns by position), in DuckDB's lossless Arrow
        types as ranks exchange them or in its default ones."""
        if batch.num_rows == 0:
            return
        self.rows += batch.num_rows
        if isinstance(self._writer, DuckdbCopy):
            self._writer.write(batch)
            return
        if any(isinstance(f.type, pa.BaseExtensionType) for f in batch.schema):
            batch = _as_duckdb_default(batch)
        batch = pa.RecordBatch.from_arrays(batch.columns, names=self.schema.names)
        if not batch.schema.equals(self.schema):
            batch = batch.cast(self.schema)
        self._writer.write_batch(batch)

    def write_table(self, table: pa.Table) -> None:
        for batch in table.to_batches():
            self.write(batch)

    def commit(self) -> None:
        if isinstance(self._writer, DuckdbCopy):
            self._writer.commit()
        else:
            self._writer.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.tmp, 0o666 & ~umask)  # as any new file would be, not mkstemp's owner-only mode
        os.replace(self.tmp, self.target)
        if self.upload_to is not None:
            try:
                objects.upload(self.target, self.upload_to)
            finally:
                self._remove_local()

    def _remove_local(self) -> None:
        if self._local_dir is not None:
            shutil.rmtree(self._local_dir, ignore_errors=True)

    def abort(self) -> None:
        try:
            if isinstance(self._writer, DuckdbCopy):
                self._writer.abort()
            else:
                self._writer.close()
        finally:
            Path(self.tmp).unlink(missing_ok=True)
            self._remove_local()


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
