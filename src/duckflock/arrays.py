"""Arrow arrays as numpy views and back without ``Array.to_numpy`` or ``pa.array``: pyarrow's
conversions import pandas on first use, where it is installed, to check what they were given (time
and memory in every rank process), which would land in the first exchange of every rank."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_DTYPES = {
    pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
    pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64,
    pa.float32(): np.float32, pa.float64(): np.float64,
}  # fmt: skip


def numpy_view(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The values of a primitive numeric array without nulls (zero-copy for a single chunk)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    dtype = _DTYPES[values.type]
    if len(values) == 0:
        return np.empty(0, dtype=dtype)
    return np.frombuffer(
        values.buffers()[1], dtype=dtype, count=len(values), offset=values.offset * np.dtype(dtype).itemsize
    )


def arrow_array(values: np.ndarray) -> pa.Array:
    """A numpy array of numbers or booleans as an Arrow array without nulls; numbers in native byte
    order share the numpy memory."""
    values = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))
    if values.dtype == np.bool_:
        bits = np.packbits(values, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def null_mask(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean numpy array: True where ``values`` is NULL."""
    if values.null_count == 0:
        return np.zeros(len(values), dtype=bool)
    return numpy_view(pc.cast(pc.is_null(values), pa.uint8())).astype(bool)


def flat(t: pa.DataType) -> bool:
    """A column of one level whose buffers are a validity bitmap and values (fixed-width, boolean,
    NULL-typed) or offsets and data (strings, binaries); not nested, dictionary, view or extension."""
    return fixed_width(t) or pa.types.is_boolean(t) or pa.types.is_null(t) or offset_width(t) is not None


def fixed_width(t: pa.DataType) -> bool:
    """Values of a whole number of bytes each (``t.bit_width // 8``)."""
    return (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_decimal(t)
        or pa.types.is_temporal(t)
        or pa.types.is_fixed_size_binary(t)
    )


def offset_width(t: pa.DataType) -> int | None:
    """Bytes per offset of a string or binary column; None for other types."""
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return 4
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return 8
    return None
