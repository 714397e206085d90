"""A result file written by DuckDB's own COPY from Arrow batches as they arrive.

Parquet and CSV files are written by DuckDB, not by pyarrow's writers, so that the file is the one
single-process DuckDB's ``COPY (query) TO`` writes: its Parquet types (UUID, HUGEINT, JSON, BIGNUM,
VARIANT, nested ones), its CSV formatting. The batches arrive pushed (from an exchange or a stage),
while COPY pulls from an Arrow stream: COPY runs in a thread of its own, reading a small queue the
pushing side fills (so at most a few batches wait, and a full queue holds the sender back).
"""

from __future__ import annotations

import contextlib
import queue
import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import duckdb
import pyarrow as pa

from duckflock.errors import DuckflockError, duckdb_message
from duckflock.local_duckdb import lossy_in_arrow, set_time_zone
from duckflock.sqltext import quote_ident, sql_literal

_END = object()
_WAITING = 4  # batches queued for COPY at most
_SOURCE = "duckflock_result_batches"


def _extended(t: pa.DataType) -> bool:
    """Whether DuckDB's lossless Arrow form is used in ``t`` (its extension types, also nested)."""
    if isinstance(t, pa.BaseExtensionType):
        return True
    return any(_extended(t.field(i).type) for i in range(t.num_fields))


def column_count_problem(got: int, planned: int) -> str | None:
    """What is wrong when a result has other columns than its plan: ones that depend on the data,
    which planning missed (the driver's whole result and a file's batches are checked alike)."""
    return None if got == planned else f"the query gave {got} columns where its plan has {planned}"


class _Aborted(Exception):
    """Ends COPY's read of the batches when the query failed."""


class DuckdbCopy:
    """COPY of a stream of batches (columns by position) into ``path``, with the result's column
    ``names`` and DuckDB ``types``: batches in DuckDB's lossless Arrow types arrive exact; columns
    whose Arrow form DuckDB reads as another type are cast to the result's."""

    def __init__(
        self,
        path: str,
        fmt: str,
        names: Sequence[str],
        types: Sequence[str],
        threads: int = 1,
        temp_dir: Path | None = None,
        time_zone: str = "",
        memory_bytes: int = 0,
    ):
        """``temp_dir``: where this DuckDB may spill (the rank's node-local spill directory), not
        the working directory, DuckDB's default. ``time_zone``: the session's (a CSV writes
        TIMESTAMPTZ values as text in it); empty: this host's. ``memory_bytes``: its memory_limit
        (a part of the rank's budget), 0 for DuckDB's default."""
        self._path, self._fmt, self._names, self._types = path, fmt, list(names), list(types)
        self._spill = tempfile.mkdtemp(prefix="copy-", dir=temp_dir)
        settings: dict[str, str | bool | int | float | list[str]] = {"threads": threads}
        settings["temp_directory"] = self._spill
        if memory_bytes:
            settings["memory_limit"] = f"{memory_bytes}B"
        self._con = duckdb.connect(config=settings)
        try:
            set_time_zone(self._con, time_zone)
        except BaseException:
            self._close()
            raise
        self._queue: queue.Queue[object] = queue.Queue(_WAITING)
        self._thread: threading.Thread | None = None
        self._schema: pa.Schema | None = None
        self._error: BaseException | None = None
        self._closed = False

    def write(self, batch: pa.RecordBatch) -> None:
        # Renamed field by field: a field's metadata can name its type (VARIANT's does).
        fields = [f.with_name(f"c{i}") for i, f in enumerate(batch.schema)]
        batch = pa.RecordBatch.from_arrays(batch.columns, schema=pa.schema(fields))
        if self._schema is None:
            self._start(batch.schema)
        elif not batch.schema.equals(self._schema):
            batch = batch.cast(self._schema)
        self._put(batch)

    def commit(self) -> None:
        assert not self._closed, "committed after it failed or was aborted"
        try:
            if self._thread is None:  # no rows: the columns alone, in the result's types
                typed = zip(self._names, self._types, strict=True)
                cols = ", ".join(f"CAST(NULL AS {t}) AS {quote_ident(n)}" for n, t in typed)
                try:
                    self._copy(f"SELECT {cols} LIMIT 0")
                except duckdb.Error as e:
                    self._error = e
            else:
                self._put(_END)
                self._thread.join()
        except BaseException:  # e.g. Ctrl-C while COPY finishes: stop it, do not wait for it
            self.abort()
            raise
        self._close()
        if self._error is not None:
            raise self._failure()

    def abort(self) -> None:
        if self._closed:
            return
        if self._thread is not None:
            if self._thread.is_alive():
                self._con.interrupt()  # COPY may be past reading the batches, writing the file
            while self._thread.is_alive():  # make room for the sentinel, then let COPY fail on it
                with contextlib.suppress(queue.Empty):
                    self._queue.get_nowait()
                with contextlib.suppress(queue.Full):
                    self._queue.put_nowait(_Aborted())
                self._thread.join(0.1)
        self._close()

    def _close(self) -> None:
        self._closed = True
        self._con.close()
        shutil.rmtree(self._spill, ignore_errors=True)

    def _start(self, schema: pa.Schema) -> None:
        wrong = column_count_problem(len(schema), len(self._names))
        if wrong:
            raise DuckflockError(wrong)
        self._con.register(_SOURCE, pa.RecordBatchReader.from_batches(schema, self._batches()))
        read = self._con.sql(f"SELECT * FROM {_SOURCE}").types  # binds; reads no batch
        cols = []
        for i, (got, name, want) in enumerate(zip(read, self._names, self._types, strict=True)):
            col, wanted = quote_ident(f"c{i}"), self._con.sqltype(want)
            if lossy_in_arrow(wanted) and not _extended(schema.field(i).type):
                raise DuckflockError(
                    f"column {name!r} of type {want} cannot be written to a {self._fmt} file exactly from "
                    "its Arrow form: CAST it to VARCHAR in the query, or write an .arrow file"
                )
            same = str(got) == str(wanted)
            cols.append(f"{col if same else f'CAST({col} AS {want})'} AS {quote_ident(name)}")
        query = f"SELECT {', '.join(cols)} FROM {_SOURCE}"
        self._schema = schema
        self._thread = threading.Thread(
            target=self._copy_here, args=(query,), name="duckflock-copy", daemon=True
        )
        self._thread.start()

    def _copy_here(self, query: str) -> None:
        """COPY on this (its own) thread: its error is kept for the writing side."""
        try:
            self._copy(query)
        except BaseException as e:
            self._error = e

    def _copy(self, query: str) -> None:
        # Straight into the file: the caller writes under a hidden temporary name and renames it
        # when complete; DuckDB's own temporary file (tmp_<name>) would outlive a killed rank.
        fmt = "FORMAT parquet" if self._fmt == "parquet" else "FORMAT csv, HEADER true"
        options = f"{fmt}, USE_TMP_FILE false"
        self._con.execute(f"COPY ({query}) TO {sql_literal(self._path)} ({options})")

    def _batches(self) -> Iterator[pa.RecordBatch]:
        while (item := self._queue.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, pa.RecordBatch)
            yield item

    def _put(self, item: object) -> None:
        assert self._thread is not None
        while True:
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                if not self._thread.is_alive():  # COPY failed: nothing reads the queue any more
                    raise self._failure() from None

    def _failure(self) -> DuckflockError:
        why = duckdb_message(self._error) if isinstance(self._error, Exception) else str(self._error)
        why = why.split("\n\nLINE ")[0].split("\nLINE ")[0]  # not the internal COPY statement
        return DuckflockError(f"the result cannot be written as {self._fmt}: {why}")
