"""The answers to Flight SQL's metadata commands, as Arrow tables of the schemas the specification
gives (Apache Arrow's format/FlightSql.proto, at each Command message), from the session's tables.

duckflock has one catalog and one schema: its tables, named ``duckflock`` and ``main`` here
(DuckDB's own names for a database's default schema are ``main``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import pyarrow as pa

CATALOG = "duckflock"
SCHEMA = "main"
TABLE_TYPE = "TABLE"

_TEXT = pa.utf8()
_NN = False  # "not null" in the specification's schemas

CATALOGS = pa.schema([pa.field("catalog_name", _TEXT, _NN)])
DB_SCHEMAS = pa.schema([pa.field("catalog_name", _TEXT), pa.field("db_schema_name", _TEXT, _NN)])
TABLE_TYPES = pa.schema([pa.field("table_type", _TEXT, _NN)])
_TABLES = [
    pa.field("catalog_name", _TEXT),
    pa.field("db_schema_name", _TEXT),
    pa.field("table_name", _TEXT, _NN),
    pa.field("table_type", _TEXT, _NN),
]
TABLES = pa.schema(_TABLES)
TABLES_WITH_SCHEMA = pa.schema([*_TABLES, pa.field("table_schema", pa.binary(), _NN)])
PRIMARY_KEYS = pa.schema(
    [
        pa.field("catalog_name", _TEXT),
        pa.field("db_schema_name", _TEXT),
        pa.field("table_name", _TEXT, _NN),
        pa.field("column_name", _TEXT, _NN),
        pa.field("key_name", _TEXT),
        pa.field("key_sequence", pa.int32(), _NN),
    ]
)
FOREIGN_KEYS = pa.schema(
    [
        pa.field("pk_catalog_name", _TEXT),
        pa.field("pk_db_schema_name", _TEXT),
        pa.field("pk_table_name", _TEXT, _NN),
        pa.field("pk_column_name", _TEXT, _NN),
        pa.field("fk_catalog_name", _TEXT),
        pa.field("fk_db_schema_name", _TEXT),
        pa.field("fk_table_name", _TEXT, _NN),
        pa.field("fk_column_name", _TEXT, _NN),
        pa.field("key_sequence", pa.int32(), _NN),
        pa.field("fk_key_name", _TEXT),
        pa.field("pk_key_name", _TEXT),
        pa.field("update_rule", pa.uint8(), _NN),
        pa.field("delete_rule", pa.uint8(), _NN),
    ]
)
XDBC_TYPE_INFO = pa.schema(
    [
        pa.field("type_name", _TEXT, _NN),
        pa.field("data_type", pa.int32(), _NN),
        pa.field("column_size", pa.int32()),
        pa.field("literal_prefix", _TEXT),
        pa.field("literal_suffix", _TEXT),
        pa.field("create_params", pa.list_(pa.field("item", _TEXT, _NN))),
        pa.field("nullable", pa.int32(), _NN),
        pa.field("case_sensitive", pa.bool_(), _NN),
        pa.field("searchable", pa.int32(), _NN),
        pa.field("unsigned_attribute", pa.bool_()),
        pa.field("fixed_prec_scale", pa.bool_(), _NN),
        pa.field("auto_increment", pa.bool_()),
        pa.field("local_type_name", _TEXT),
        pa.field("minimum_scale", pa.int32()),
        pa.field("maximum_scale", pa.int32()),
        pa.field("sql_data_type", pa.int32(), _NN),
        pa.field("datetime_subcode", pa.int32()),
        pa.field("num_prec_radix", pa.int32()),
        pa.field("interval_precision", pa.int32()),
    ]
)


def like(pattern: str | None) -> Callable[[str], bool]:
    """A Flight SQL filter pattern (``%``: any text, ``_``: one character) as a test of a name;
    None: every name."""
    if pattern is None:
        return lambda name: True
    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    compiled = re.compile(regex, re.DOTALL)
    return lambda name: compiled.fullmatch(name) is not None


def catalog_matches(catalog: str | None) -> bool:
    return catalog is None or catalog == CATALOG


def catalogs() -> pa.Table:
    return pa.Table.from_pylist([{"catalog_name": CATALOG}], schema=CATALOGS)


def db_schemas(catalog: str | None, pattern: str | None) -> pa.Table:
    rows = [{"catalog_name": CATALOG, "db_schema_name": SCHEMA}]
    keep = catalog_matches(catalog) and like(pattern)(SCHEMA)
    return pa.Table.from_pylist(rows if keep else [], schema=DB_SCHEMAS)


def table_types() -> pa.Table:
    return pa.Table.from_pylist([{"table_type": TABLE_TYPE}], schema=TABLE_TYPES)


def tables(
    names: Iterable[str],
    catalog: str | None,
    schema_pattern: str | None,
    name_pattern: str | None,
    types: list[str],
    schema_of: Callable[[str], pa.Schema] | None,
) -> pa.Table:
    """The tables ``names`` that the filters keep; with ``schema_of`` each one's Arrow schema too."""
    keep = catalog_matches(catalog) and like(schema_pattern)(SCHEMA) and (not types or TABLE_TYPE in types)
    matches = like(name_pattern)
    rows: list[dict[str, object]] = []
    for name in sorted(names) if keep else []:
        if not matches(name):
            continue
        row: dict[str, object] = {
            "catalog_name": CATALOG,
            "db_schema_name": SCHEMA,
            "table_name": name,
            "table_type": TABLE_TYPE,
        }
        if schema_of is not None:
            row["table_schema"] = schema_of(name).serialize().to_pybytes()
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=TABLES_WITH_SCHEMA if schema_of else TABLES)


def xdbc_type_info(data_type: int | None) -> pa.Table:
    """DuckDB's common types, each with its XDBC (JDBC/ODBC) type code, ordered by that code then
    name, as the specification asks."""
    rows = [_xdbc_row(name, code, size, prefix, radix) for name, code, size, prefix, radix in _XDBC_TYPES]
    if data_type is not None:
        rows = [r for r in rows if r["data_type"] == data_type]
    rows.sort(key=lambda r: (r["data_type"], r["type_name"]))
    return pa.Table.from_pylist(rows, schema=XDBC_TYPE_INFO)


# (DuckDB type, XdbcDataType code, column size, literal prefix, numeric radix)
_XDBC_TYPES: list[tuple[str, int, int | None, str | None, int | None]] = [
    ("BOOLEAN", 16, 1, None, None),
    ("TINYINT", -6, 3, None, 10),
    ("SMALLINT", 5, 5, None, 10),
    ("INTEGER", 4, 10, None, 10),
    ("BIGINT", -5, 19, None, 10),
    ("HUGEINT", 2, 38, None, 10),
    ("DECIMAL", 3, 38, None, 10),
    ("FLOAT", 6, 24, None, 2),
    ("DOUBLE", 8, 53, None, 2),
    ("VARCHAR", 12, None, "'", None),
    ("BLOB", -3, None, "'", None),
    ("DATE", 91, 10, "DATE '", None),
    ("TIME", 92, 15, "TIME '", None),
    ("TIMESTAMP", 93, 26, "TIMESTAMP '", None),
    ("TIMESTAMP WITH TIME ZONE", 93, 32, "TIMESTAMPTZ '", None),
    ("INTERVAL", 10, None, "INTERVAL '", None),
]


def _xdbc_row(name: str, code: int, size: int | None, prefix: str | None, radix: int | None) -> dict:
    datetime = {91: 1, 92: 2, 93: 3}  # XdbcDatetimeSubcode: DATE, TIME, TIMESTAMP
    return {
        "type_name": name,
        "data_type": code,
        "column_size": size,
        "literal_prefix": prefix,
        "literal_suffix": "'" if prefix else None,
        "create_params": ["precision", "scale"] if name == "DECIMAL" else None,
        "nullable": 1,  # NULLABILITY_NULLABLE
        "case_sensitive": name == "VARCHAR",
        "searchable": 3,  # SEARCHABLE_FULL
        "unsigned_attribute": False if radix else None,
        "fixed_prec_scale": False,
        "auto_increment": False if radix else None,
        "local_type_name": name,
        "minimum_scale": 0 if name == "DECIMAL" else None,
        "maximum_scale": 38 if name == "DECIMAL" else None,
        "sql_data_type": 9 if code in datetime else code,  # XDBC_DATETIME for the date and time types
        "datetime_subcode": datetime.get(code),
        "num_prec_radix": radix,
        "interval_precision": None,
    }


def with_type_names(schema: pa.Schema, types: tuple[str, ...]) -> pa.Schema:
    """``schema`` whose fields carry their DuckDB type name, as the specification's column metadata
    ARROW:FLIGHT:SQL:TYPE_NAME (JDBC's getColumnTypeName reads it); as it is where the types are
    not known (a plan may not give them)."""
    if len(types) != len(schema):
        return schema
    fields = [
        f.with_metadata({**(f.metadata or {}), b"ARROW:FLIGHT:SQL:TYPE_NAME": t.encode()})
        for f, t in zip(schema, types, strict=True)
    ]
    return pa.schema(fields, metadata=schema.metadata)
