"""Pickles of duckflock's messages whose Arrow schemas, fields and types unpickle as they were.

PyArrow pickles a field by its constructor's arguments, and its constructor refuses some fields
DuckDB exports: ``MAP {}`` has the type ``map<null, null>``, whose key field is a non-nullable
``null``. Such a message pickled, but unpickling it raised on the rank, whose loop died and left the
driver waiting. Here they travel as Arrow IPC schema bytes, which hold any schema Arrow has (a
Python-defined extension type comes back as itself only where it is registered with pyarrow; the
ones DuckDB exports, arrow.uuid, arrow.json and arrow.opaque, are Arrow's own).
"""

from __future__ import annotations

import copyreg
import io
import pickle
from typing import Any

import pyarrow as pa


def dumps(obj: Any) -> bytes:
    out = io.BytesIO()
    _Pickler(out, protocol=5).dump(obj)
    return out.getvalue()


def _schema(data: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(data))


def _field(data: bytes) -> pa.Field:
    return _schema(data).field(0)


def _type(data: bytes) -> pa.DataType:
    return _field(data).type


def _reduce_schema(schema: pa.Schema) -> tuple:
    return _schema, (schema.serialize().to_pybytes(),)


def _reduce_field(field: pa.Field) -> tuple:
    return _field, (pa.schema([field]).serialize().to_pybytes(),)


def _reduce_type(type_: pa.DataType) -> tuple:
    return _type, (pa.schema([pa.field("t", type_)]).serialize().to_pybytes(),)


class _Pickler(pickle.Pickler):
    dispatch_table = copyreg.dispatch_table.copy()
    dispatch_table[pa.Schema] = _reduce_schema
    dispatch_table[pa.Field] = _reduce_field

    def reducer_override(self, obj: Any) -> Any:
        # Arrow's types are subclasses of DataType (ListType, MapType, ...): the dispatch table is
        # consulted by exact class only.
        if isinstance(obj, pa.DataType):
            return _reduce_type(obj)
        return NotImplemented
