"""DuckDB's AVG of integers and decimals, finished from a global sum and count exactly as DuckDB
finishes it, bit for bit.

A split AVG sums and counts per rank and divides once the partials meet. DuckDB's own division is
not a plain SQL one: unless its optimizer rewrites AVG(x) as SUM(x) / COUNT(x) (see
``plan/aggregates.py``), it divides the sum as an x87 ``long double`` by ``count * 10^scale``
(also a ``long double``) and rounds the quotient to DOUBLE; for a 2-byte argument (SMALLINT,
DECIMAL of up to 4 digits) it divides in DOUBLE. SQL has no ``long double``, so a vectorized Python
function (numpy's ``longdouble`` is the same 80-bit type on x86-64 Linux) does that last step.
TPC-H Q1's ``avg(l_discount)`` differs in its last digit otherwise.
"""

from __future__ import annotations

import atexit
import contextlib
import weakref

import duckdb
import numpy as np
import pyarrow as pa
from duckdb import sqltypes
from duckdb.func import FunctionNullHandling, PythonUDFType

# One function per decimal scale: a DECIMAL(38, s) argument arrives as Arrow decimal128 holding the
# unscaled integer, which is what DuckDB divides (declared as DECIMAL(38, 0), the sum would be
# rescaled first). Integer sums come as HUGEINT.
_INTEGER_NAME = "duckflock_avg_int"
_MAX_SCALE = 38
_LD = np.longdouble
# numpy's longdouble must be the 64-bit-mantissa x87 type DuckDB's long double is; elsewhere (a
# platform where it is a plain double, or 128-bit) the planner does not split such an AVG.
EXACT = np.finfo(_LD).nmant == 63


def finalize_sql(total: str, count: str, arg_type: str) -> str | None:
    """SQL for DuckDB's AVG of ``arg_type`` values from their exact ``total`` (the SUM of the
    partial sums: HUGEINT, or DECIMAL(38, s)) and ``count`` (the SUM of the partial counts); None
    where it cannot be reproduced."""
    if not EXACT:
        return None
    t = arg_type.upper().replace(" ", "")
    if t.startswith("DECIMAL("):
        width, scale = (int(v) for v in t[len("DECIMAL(") : -1].split(","))
        small = width <= 4  # stored in 2 bytes
        return f"duckflock_avg_s{scale}(CAST({total} AS DECIMAL(38,{scale})), {count}, {str(small).upper()})"
    if t in ("TINYINT", "SMALLINT", "UTINYINT"):
        return f"{_INTEGER_NAME}(CAST({total} AS HUGEINT), {count}, TRUE)"
    if t in ("INTEGER", "BIGINT", "HUGEINT", "USMALLINT", "UINTEGER", "UBIGINT"):
        return f"{_INTEGER_NAME}(CAST({total} AS HUGEINT), {count}, FALSE)"
    return None


def register(con: duckdb.DuckDBPyConnection) -> None:
    """Make ``finalize_sql``'s functions callable on ``con``."""
    if not EXACT:
        return
    _open.add(con)
    totals = [(f"duckflock_avg_s{s}", duckdb.decimal_type(38, s), s) for s in range(_MAX_SCALE + 1)]
    for name, total, scale in [*totals, (_INTEGER_NAME, sqltypes.HUGEINT, 0)]:
        con.create_function(
            name,
            _finalizer(scale),
            [total, sqltypes.HUGEINT, sqltypes.BOOLEAN],
            sqltypes.DOUBLE,
            type=PythonUDFType.ARROW,
            null_handling=FunctionNullHandling.SPECIAL,  # NULL in, NULL out; and NULL for no rows
            side_effects=False,
        )


# A connection with Python functions still open when the interpreter exits (a session the caller
# never closed) makes DuckDB's Python binding print a page about leaked objects: close them first.
_open: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()


@atexit.register
def _close_open() -> None:
    for con in list(_open):
        with contextlib.suppress(duckdb.Error):
            con.close()


def _finalizer(scale: int):
    # DuckDB keeps the divisor's power of ten as a double made from a long double.
    ten = 10**scale
    lo, hi = np.array([ten & (2**64 - 1)], np.uint64), np.array([ten >> 64], np.int64)
    power = float(_hugeint_to_ld(lo, hi)[0])

    def finalize(total: pa.ChunkedArray, count: pa.ChunkedArray, small: pa.ChunkedArray) -> pa.Array:
        t, n = total.combine_chunks(), count.combine_chunks()
        lo, hi = _words(t)
        n_lo, _ = _words(n)  # a count is below 2^64
        null = _nulls(t) | _nulls(n) | (n_lo == 0)
        divisor_rows = np.where(null, 1, n_lo)
        if len(small) and small[0].as_py():  # IntegerAverageOperation: int64 sum, double division
            out = lo.view(np.int64).astype(np.float64) / (divisor_rows.astype(np.float64) * power)
        else:  # IntegerAverageOperationHugeint / HugeintAverageOperation: long double division
            out = (_hugeint_to_ld(lo, hi) / (divisor_rows.astype(_LD) * _LD(power))).astype(np.float64)
        # Built from buffers: pyarrow's conversions from numpy import pandas, which ranks never load.
        valid = pa.py_buffer(np.packbits(~null, bitorder="little"))
        return pa.Array.from_buffers(pa.float64(), len(out), [valid, pa.py_buffer(np.ascontiguousarray(out))])

    return finalize


def _words(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(low uint64, high int64) halves of each 16-byte little-endian integer of ``arr`` (decimal128
    unscaled values, or DuckDB's HUGEINT as an Arrow extension over fixed_size_binary(16))."""
    storage = _storage(arr)
    words = np.frombuffer(storage.buffers()[1], dtype=np.uint64)[
        2 * storage.offset : 2 * (storage.offset + len(storage))
    ]
    return words[0::2], words[1::2].view(np.int64)


def _storage(arr: pa.Array) -> pa.Array:
    return arr.storage if isinstance(arr, pa.ExtensionArray) else arr


def _nulls(arr: pa.Array) -> np.ndarray:
    """Which entries are NULL, from the validity bitmap (pyarrow's boolean-to-numpy conversion
    imports pandas)."""
    storage = _storage(arr)
    bitmap = storage.buffers()[0]
    if storage.null_count == 0 or bitmap is None:
        return np.zeros(len(storage), dtype=bool)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return bits[storage.offset : storage.offset + len(storage)] == 0


def _hugeint_to_ld(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """DuckDB's HUGEINT to long double (CastBigintToFloating): lower + upper * 2^64, with its own
    path for an upper half of -1."""
    out = lo.astype(_LD) + hi.astype(_LD) * _LD(2.0**64)
    minus = hi == -1
    out[minus] = -(np.uint64(2**64 - 1) - lo[minus]).astype(_LD) - 1
    return out
