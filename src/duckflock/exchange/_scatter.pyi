# The compiled loops of _scatter.c.
from typing import TypeAlias

# Any object with the buffer protocol (numpy arrays, Arrow buffers), contiguous; outputs writable.
Buffer: TypeAlias = object
WriteableBuffer: TypeAlias = object

def histogram(targets: Buffer, size: int, counts: WriteableBuffer) -> None: ...
def scatter_fixed(
    values: Buffer, offset_bytes: int, width: int, targets: Buffer, at: WriteableBuffer, outs: list
) -> None: ...
def scatter_bits(
    bitmap: Buffer | None,
    offset_bits: int,
    targets: Buffer,
    at: WriteableBuffer,
    outs: list,
    ones: WriteableBuffer,
) -> None: ...
def var_sizes(
    offsets: Buffer, offset_width: int, row: int, targets: Buffer, sizes: WriteableBuffer
) -> None: ...
def scatter_var(
    offsets: Buffer,
    offset_width: int,
    row: int,
    data: Buffer,
    targets: Buffer,
    slots: WriteableBuffer,
    positions: WriteableBuffer,
    out_offsets: list,
    out_data: list,
) -> None: ...
