"""Record batches on the wire, in one of two encodings.

- Arrow IPC: one stream per message, optionally with LZ4/ZSTD body compression (worth it on slow
  links, not in memory). Used by Flight, with compression, and for nested or dictionary columns.
- Frames: a header plus the batches' own buffers, for transports that send a list of buffers
  without joining them (MPI) — no copy on either side.
"""

from __future__ import annotations

import functools
import pickle

import pyarrow as pa

from duckflock.arrays import flat


def write_options(compression: str) -> pa.ipc.IpcWriteOptions:
    codec = None if compression in ("", "none") else compression
    return pa.ipc.IpcWriteOptions(compression=codec, use_threads=codec is not None)


def encode(schema: pa.Schema, batches: list[pa.RecordBatch], options: pa.ipc.IpcWriteOptions) -> pa.Buffer:
    """Serialize into one buffer: the one copy of the data on the sending side.

    Uncompressed, the exact size is known up front, so the stream is written into one allocation
    instead of a growing buffer that would copy the data again on every doubling."""
    # Dictionary-encoded columns (DuckDB's ENUMs) add dictionary messages the size below leaves out.
    dictionary = any(pa.types.is_dictionary(f.type) for f in schema)
    if options.compression is not None or dictionary:
        sink = pa.BufferOutputStream()
        _write(sink, schema, batches, options)
        return sink.getvalue()
    size = schema.serialize().size + sum(pa.ipc.get_record_batch_size(b) for b in batches) + 16
    buf = pa.allocate_buffer(size, resizable=True)
    stream = pa.FixedSizeBufferWriter(buf)
    _write(stream, schema, batches, options)
    written = stream.tell()
    return buf.slice(0, written)


def _write(sink, schema: pa.Schema, batches: list[pa.RecordBatch], options: pa.ipc.IpcWriteOptions) -> None:
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        for b in batches:
            writer.write_batch(b)


def decode(payload: object) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """Zero-copy: the batches reference the received buffer."""
    reader = pa.ipc.open_stream(pa.py_buffer(payload))
    return reader.schema, list(reader)


# ---- frames: a message as a list of buffers, for transports that send them without joining them ----
# Arrow IPC copies every buffer into one stream; MPI can instead send each buffer where it lies and
# receive each into its own allocation, so a batch crosses with the one copy MPI makes. The first
# frame is a small header (schema and buffer layout); the rest are the batches' buffers as they are.


def frames_supported(schema: pa.Schema) -> bool:
    """Flat columns only; nested, dictionary, view and extension types keep the IPC encoding."""
    return all(flat(f.type) for f in schema)


def to_frames(schema_bytes: bytes, batches: list[pa.RecordBatch]) -> list[object]:
    """[header, buffer, buffer, …]: the batches' buffers, not copied — except a column that is a
    small slice of much larger buffers, which is compacted first rather than sent whole."""
    frames: list[object] = [b""]
    layouts = []
    for batch in batches:
        columns = []
        for column in batch.columns:
            column = _compact(column)
            refs = []
            for buf in column.buffers():
                if buf is None:
                    refs.append(-1)
                else:
                    refs.append(len(frames))
                    frames.append(buf)
            columns.append((len(column), column.null_count, column.offset, refs))
        layouts.append((batch.num_rows, columns))
    frames[0] = pickle.dumps((schema_bytes, layouts), protocol=5)
    return frames


def from_frames(frames: list) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """Zero-copy: the arrays reference the received frames."""
    schema_bytes, layouts = pickle.loads(memoryview(frames[0]))
    schema = _schema(bytes(schema_bytes))
    buffers = [None, *(pa.py_buffer(f) for f in frames[1:])]
    batches = []
    for rows, columns in layouts:
        if not columns:  # no columns, only a row count (e.g. what count(*) needs)
            batches.append(no_columns(rows, schema))
            continue
        arrays = [
            pa.Array.from_buffers(
                field.type, length, [None if r < 0 else buffers[r] for r in refs], null_count, offset
            )
            for field, (length, null_count, offset, refs) in zip(schema, columns, strict=True)
        ]
        batches.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
    return schema, batches


def _compact(column: pa.Array) -> pa.Array:
    """``column`` itself, or a copy of just its rows when its buffers hold far more than them."""
    held = sum(b.size for b in column.buffers() if b is not None)
    return pa.concat_arrays([column]) if held > 2 * column.nbytes + 4096 else column


def no_columns(rows: int, schema: pa.Schema) -> pa.RecordBatch:
    """A batch of ``rows`` rows and no columns."""
    batch = pa.RecordBatch.from_arrays([pa.nulls(rows)], names=["_"]).drop_columns(["_"])
    return batch.replace_schema_metadata(schema.metadata)


@functools.lru_cache(maxsize=64)
def _schema(schema_bytes: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(schema_bytes))
