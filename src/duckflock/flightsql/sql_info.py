"""The answer to Flight SQL's GetSqlInfo: what this server and its SQL (DuckDB's, read-only) are
and support, by the specification's SqlInfo codes (Apache Arrow's format/FlightSql.proto, enum
SqlInfo; the bitmasks and ordinals by the enums named there). JDBC's DatabaseMetaData answers
from these, and fails on a code left out: BI tools ask for most of them."""

from __future__ import annotations

import functools
from collections.abc import Iterable

import pyarrow as pa

_TEXT = pa.utf8()
VALUE = pa.dense_union(
    [
        pa.field("string_value", _TEXT),
        pa.field("bool_value", pa.bool_()),
        pa.field("bigint_value", pa.int64()),
        pa.field("int32_bitmask", pa.int32()),
        pa.field("string_list", pa.list_(pa.field("item", _TEXT))),
        pa.field("int32_to_int32_list_map", pa.map_(pa.int32(), pa.list_(pa.field("item", pa.int32())))),
    ]
)
SCHEMA = pa.schema([pa.field("info_name", pa.uint32(), False), pa.field("value", VALUE, False)])


class Int64(int):
    """A value the specification gives as int64 (the SQL_MAX_* limits); a plain int is an int32."""


Value = str | bool | int | list[str] | dict[int, list[int]]

# The SQL_MAX_* limits (541-561), int64: 0 means no limit, or none known.
_LIMITS = dict.fromkeys(range(541, 562), Int64(0))

_FUNCTIONS = {
    509: ["abs", "ceil", "floor", "round", "sqrt", "exp", "ln", "log10", "power", "sign", "mod", "pi"],
    510: ["concat", "length", "lower", "upper", "trim", "substring", "replace", "position", "left", "right"],
    511: ["current_database", "current_schema", "version"],
    512: ["current_date", "current_timestamp", "date_part", "date_trunc", "extract", "now", "strftime"],
}


@functools.cache
def values() -> dict[int, Value]:
    """SqlInfo code -> its value here."""
    import duckdb

    from duckflock.versions import engine_versions

    con = duckdb.connect()
    try:
        rows = con.execute("SELECT keyword_name FROM duckdb_keywords() ORDER BY 1").fetchall()
    finally:
        con.close()
    return {
        0: "duckflock",  # FLIGHT_SQL_SERVER_NAME
        1: engine_versions()["duckflock"],  # FLIGHT_SQL_SERVER_VERSION
        2: pa.__version__,  # FLIGHT_SQL_SERVER_ARROW_VERSION
        3: True,  # FLIGHT_SQL_SERVER_READ_ONLY
        4: True,  # FLIGHT_SQL_SERVER_SQL
        5: False,  # FLIGHT_SQL_SERVER_SUBSTRAIT
        8: 0,  # FLIGHT_SQL_SERVER_TRANSACTION: SQL_SUPPORTED_TRANSACTION_NONE
        9: False,  # FLIGHT_SQL_SERVER_CANCEL (a query stops when its client goes)
        500: False,  # SQL_DDL_CATALOG
        501: False,  # SQL_DDL_SCHEMA
        502: False,  # SQL_DDL_TABLE
        503: 1,  # SQL_IDENTIFIER_CASE: case-insensitive, as DuckDB's names are
        504: '"',  # SQL_IDENTIFIER_QUOTE_CHAR
        505: 1,  # SQL_QUOTED_IDENTIFIER_CASE: case-insensitive too
        506: True,  # SQL_ALL_TABLES_ARE_SELECTABLE
        507: 3,  # SQL_NULL_ORDERING: SQL_NULLS_SORTED_AT_END (DuckDB's NULLS LAST both ways)
        508: [k for (k,) in rows],  # SQL_KEYWORDS
        **_FUNCTIONS,  # SQL_NUMERIC/STRING/SYSTEM/DATETIME_FUNCTIONS: the common ones
        513: "\\",  # SQL_SEARCH_STRING_ESCAPE
        514: "",  # SQL_EXTRA_NAME_CHARACTERS
        515: True,  # SQL_SUPPORTS_COLUMN_ALIASING
        516: True,  # SQL_NULL_PLUS_NULL_IS_NULL
        517: {},  # SQL_SUPPORTS_CONVERT: none declared (CAST converts)
        518: True,  # SQL_SUPPORTS_TABLE_CORRELATION_NAMES
        519: False,  # SQL_SUPPORTS_DIFFERENT_TABLE_CORRELATION_NAMES
        520: True,  # SQL_SUPPORTS_EXPRESSIONS_IN_ORDER_BY
        521: True,  # SQL_SUPPORTS_ORDER_BY_UNRELATED
        522: 0b11,  # SQL_SUPPORTED_GROUP_BY: unrelated, beyond select
        523: True,  # SQL_SUPPORTS_LIKE_ESCAPE_CLAUSE
        524: True,  # SQL_SUPPORTS_NON_NULLABLE_COLUMNS
        525: 0b11,  # SQL_SUPPORTED_GRAMMAR: minimum, core
        526: 0b11,  # SQL_ANSI92_SUPPORTED_LEVEL: entry, intermediate
        527: False,  # SQL_SUPPORTS_INTEGRITY_ENHANCEMENT_FACILITY
        528: 2,  # SQL_OUTER_JOINS_SUPPORT_LEVEL: SQL_FULL_OUTER_JOINS
        529: "schema",  # SQL_SCHEMA_TERM
        530: "procedure",  # SQL_PROCEDURE_TERM
        531: "catalog",  # SQL_CATALOG_TERM
        532: True,  # SQL_CATALOG_AT_START
        533: 0,  # SQL_SCHEMAS_SUPPORTED_ACTIONS
        534: 0,  # SQL_CATALOGS_SUPPORTED_ACTIONS
        535: 0,  # SQL_SUPPORTED_POSITIONED_COMMANDS
        536: False,  # SQL_SELECT_FOR_UPDATE_SUPPORTED
        537: False,  # SQL_STORED_PROCEDURES_SUPPORTED
        538: 0b1111,  # SQL_SUPPORTED_SUBQUERIES: comparisons, EXISTS, IN, quantified
        539: True,  # SQL_CORRELATED_SUBQUERIES_SUPPORTED
        540: 0b11,  # SQL_SUPPORTED_UNIONS: UNION, UNION ALL
        **_LIMITS,
        562: 0,  # SQL_DEFAULT_TRANSACTION_ISOLATION: SQL_TRANSACTION_NONE
        563: False,  # SQL_TRANSACTIONS_SUPPORTED
        564: 0,  # SQL_SUPPORTED_TRANSACTIONS_ISOLATION_LEVELS
        565: False,  # SQL_DATA_DEFINITION_CAUSES_TRANSACTION_COMMIT
        566: False,  # SQL_DATA_DEFINITIONS_IN_TRANSACTIONS_IGNORED
        567: 0b10,  # SQL_SUPPORTED_RESULT_SET_TYPES: forward only
        **dict.fromkeys(range(568, 572), 0b10),  # SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_*: read only
        572: False,  # SQL_BATCH_UPDATES_SUPPORTED
        573: False,  # SQL_SAVEPOINTS_SUPPORTED
        574: False,  # SQL_NAMED_PARAMETERS_SUPPORTED
        575: False,  # SQL_LOCATORS_UPDATE_COPY
        576: False,  # SQL_STORED_FUNCTIONS_USING_CALL_SYNTAX_SUPPORTED
    }


def _kind(value: Value) -> int:
    """The union's type code of one value."""
    if isinstance(value, bool):
        return 1
    if isinstance(value, Int64):
        return 2
    if isinstance(value, int):
        return 3
    if isinstance(value, list):
        return 4
    if isinstance(value, dict):
        return 5
    return 0


def sql_info(codes: Iterable[int]) -> pa.Table:
    """The rows for ``codes`` (all when empty); codes not known here are left out, as allowed."""
    known = values()
    names = [c for c in (list(codes) or sorted(known)) if c in known]
    kinds, offsets = [], []
    children: list[list[object]] = [[] for _ in VALUE]
    for code in names:
        value = known[code]
        kind = _kind(value)
        kinds.append(kind)
        offsets.append(len(children[kind]))
        children[kind].append(list(value.items()) if isinstance(value, dict) else value)
    arrays = [pa.array(vs, type=f.type) for vs, f in zip(children, VALUE, strict=True)]
    union = pa.UnionArray.from_dense(
        pa.array(kinds, pa.int8()), pa.array(offsets, pa.int32()), arrays, [f.name for f in VALUE]
    )
    return pa.Table.from_arrays([pa.array(names, pa.uint32()), union], schema=SCHEMA)
