"""Arrow IPC framing of record batches for the wire: one IPC stream per message, optionally with
LZ4/ZSTD body compression (worth it on slow links, not in memory)."""

from __future__ import annotations

import pyarrow as pa


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
