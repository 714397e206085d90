"""The Flight SQL protobuf messages that ``duckflock serve`` reads and writes.

Defined here field by field, as Apache Arrow's format/FlightSql.proto (package
``arrow.flight.protocol.sql``) declares them, and built into message classes with ``protobuf`` at
import: no .proto file is fetched and no code is generated, so a fresh checkout installs and runs
offline, with no build step that could go stale. Only the field numbers, types and names matter on
the wire; each message is checked against real clients (ADBC) by the tests. Commands and action
bodies travel wrapped in ``google.protobuf.Any`` whose type URL names the message.
"""

from __future__ import annotations

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

PACKAGE = "arrow.flight.protocol.sql"
TYPE_URL_PREFIX = "type.googleapis.com/"

_F = descriptor_pb2.FieldDescriptorProto
_KINDS = {"string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES, "bool": _F.TYPE_BOOL}
_KINDS |= {"int32": _F.TYPE_INT32, "uint32": _F.TYPE_UINT32, "int64": _F.TYPE_INT64}

# message name -> its fields: (number, name, type, "optional" | "repeated" | "").
_MESSAGES: dict[str, list[tuple[int, str, str, str]]] = {
    "CommandGetSqlInfo": [(1, "info", "uint32", "repeated")],
    "CommandGetXdbcTypeInfo": [(1, "data_type", "int32", "optional")],
    "CommandGetCatalogs": [],
    "CommandGetDbSchemas": [
        (1, "catalog", "string", "optional"),
        (2, "db_schema_filter_pattern", "string", "optional"),
    ],
    "CommandGetTables": [
        (1, "catalog", "string", "optional"),
        (2, "db_schema_filter_pattern", "string", "optional"),
        (3, "table_name_filter_pattern", "string", "optional"),
        (4, "table_types", "string", "repeated"),
        (5, "include_schema", "bool", ""),
    ],
    "CommandGetTableTypes": [],
    **{
        name: [
            (1, "catalog", "string", "optional"),
            (2, "db_schema", "string", "optional"),
            (3, "table", "string", ""),
        ]
        for name in ("CommandGetPrimaryKeys", "CommandGetExportedKeys", "CommandGetImportedKeys")
    },
    "CommandGetCrossReference": [
        (1, "pk_catalog", "string", "optional"),
        (2, "pk_db_schema", "string", "optional"),
        (3, "pk_table", "string", ""),
        (4, "fk_catalog", "string", "optional"),
        (5, "fk_db_schema", "string", "optional"),
        (6, "fk_table", "string", ""),
    ],
    "ActionCreatePreparedStatementRequest": [
        (1, "query", "string", ""),
        (2, "transaction_id", "bytes", "optional"),
    ],
    "ActionCreatePreparedStatementResult": [
        (1, "prepared_statement_handle", "bytes", ""),
        (2, "dataset_schema", "bytes", ""),
        (3, "parameter_schema", "bytes", ""),
    ],
    "ActionClosePreparedStatementRequest": [(1, "prepared_statement_handle", "bytes", "")],
    "CommandStatementQuery": [(1, "query", "string", ""), (2, "transaction_id", "bytes", "optional")],
    "CommandStatementUpdate": [(1, "query", "string", ""), (2, "transaction_id", "bytes", "optional")],
    "TicketStatementQuery": [(1, "statement_handle", "bytes", "")],
    "CommandPreparedStatementQuery": [(1, "prepared_statement_handle", "bytes", "")],
    "CommandPreparedStatementUpdate": [(1, "prepared_statement_handle", "bytes", "")],
    "DoPutUpdateResult": [(1, "record_count", "int64", "")],
    # Flight's own CancelFlightInfo action (Flight.proto, package arrow.flight.protocol), whose body
    # is not wrapped in Any: the request's FlightInfo read as bytes (an embedded message is that on
    # the wire, which FlightInfo.deserialize then reads), the result's CancelStatus enum as int32.
    "CancelFlightInfoRequest": [(1, "info", "bytes", "")],
    "CancelFlightInfoResult": [(1, "status", "int32", "")],
}

# Commands of the specification that a read-only server refuses, by name, rather than as unknown.
WRITE_COMMANDS = frozenset(
    {"CommandStatementUpdate", "CommandPreparedStatementUpdate", "CommandStatementIngest"}
)


def _file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(
        name="duckflock_flight_sql.proto", package=PACKAGE, syntax="proto3"
    )
    for name, fields in _MESSAGES.items():
        m = f.message_type.add(name=name)
        for number, field_name, kind, label in fields:
            field = m.field.add(name=field_name, number=number, type=_KINDS[kind], json_name=field_name)
            field.label = _F.LABEL_REPEATED if label == "repeated" else _F.LABEL_OPTIONAL
            if label == "optional":  # proto3 `optional`: presence, through a synthetic oneof
                field.proto3_optional = True
                field.oneof_index = len(m.oneof_decl)
                m.oneof_decl.add(name=f"_{field_name}")
    return f


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())
MESSAGES: dict[str, type[Message]] = {
    name: message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))
    for name in _MESSAGES
}


class BadMessage(ValueError):
    """Bytes that are not the Flight SQL message expected."""


def new(name: str, **fields: object) -> Message:
    return MESSAGES[name](**fields)


def pack(message: Message) -> bytes:
    """``message`` wrapped in ``google.protobuf.Any``, serialized."""
    wrapped = any_pb2.Any()
    wrapped.Pack(message)
    return wrapped.SerializeToString()


def unpack(data: bytes) -> tuple[str, Message | None]:
    """(the message's name, the message) of an Any-wrapped command; None for a message of
    ``arrow.flight.protocol.sql`` not defined here (the caller refuses it by name)."""
    wrapped = any_pb2.Any()
    try:
        wrapped.ParseFromString(data)
    except DecodeError:
        raise BadMessage("not a Flight SQL command (a google.protobuf.Any message)") from None
    full_name = wrapped.type_url.rpartition("/")[2]
    package, _, name = full_name.rpartition(".")
    if package != PACKAGE:
        raise BadMessage(f"not a Flight SQL command (type URL {wrapped.type_url!r})")
    if name not in MESSAGES:
        return name, None
    return name, parse(name, wrapped.value)


def parse(name: str, data: bytes) -> Message:
    """The message ``name`` from its serialized (not Any-wrapped) bytes."""
    message = MESSAGES[name]()
    try:
        message.ParseFromString(data)
    except DecodeError:
        raise BadMessage(f"a malformed {name} message") from None
    return message
