"""``duckflock serve``: an Arrow Flight SQL endpoint in front of a session (``duckflock.connect``).

A query (CommandStatementQuery, or a prepared statement's CommandPreparedStatementQuery) runs on the
session's ranks when the client asks for its FlightInfo; its rows are held, for that caller only,
until the client fetches them with DoGet (the ticket names them) or ``idle_timeout_s`` passes
(results.py: a large one on disk); a prepared statement until the client closes it or leaves it
unused that long. A large unordered result is not held here: it stays on the ranks, and its
FlightInfo names an endpoint per rank, each serving its part (parts.py).
Metadata commands (GetTables, GetSqlInfo, ...) are answered from the catalog the same way.

Refusals are gRPC statuses the client shows: INVALID_ARGUMENT for an SQL error, a statement that
writes, or a malformed message (with duckflock's message); UNIMPLEMENTED for a command or action
this server does not offer; NOT_FOUND for a ticket or prepared statement it does not hold for the
caller (PERMISSION_DENIED from a rank, for a ticket of a part another principal asked for).
Nothing a client sends is unpickled or evaluated: commands are protobuf messages, parameters Arrow
data, queries SQL text that duckflock plans (it runs only SELECT, DESCRIBE and SHOW TABLES).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.flight as flight

from duckflock.config import Config
from duckflock.errors import DuckflockError, QueryCancelled
from duckflock.flightsql import metadata, params, parts, protocol, sql_info
from duckflock.flightsql.auth import AuthMiddleware, CallerMiddleware, Credentials, NoHandshake
from duckflock.flightsql.results import SPILL_BYTES, ResultStore
from duckflock.session import Result, Session
from duckflock.sqltext import quote_ident as q

PREFIX = "duckflock serve: "
CREATE_PREPARED = "CreatePreparedStatement"
CLOSE_PREPARED = "ClosePreparedStatement"
CANCEL_FLIGHT_INFO = "CancelFlightInfo"
CANCEL_STATUS = {"unspecified": 0, "cancelled": 1}  # Flight.proto's CancelStatus
GONE_POLL_S = 0.2  # how often a running query looks whether its client has gone

T = TypeVar("T")


def open_session(data: str, ranks: int, transport: str = "threads") -> Session:
    """The session a server answers from over ranks here: their DuckDBs read files in the data
    directory only, as Flight workers' do (clients are remote; no query reads the server's other
    files). Over Flight workers: ``duckflock.connect(workers=...)``, whose workers are confined so."""
    import duckflock

    return duckflock.connect(data, ranks=ranks, transport=transport, config={"restrict_to_data_dir": True})


@dataclass
class _Call:
    caller: str  # its identity (auth.py)
    gone: Callable[[], bool]  # whether the client has gone: cancelled, timed out, disconnected


@dataclass(frozen=True)
class _Parts:
    """A result left on the ranks, each serving its part."""

    schema: pa.Schema
    held: list[parts.PartInfo]
    serving: parts.PartServing


@dataclass
class _Prepared:
    owner: str
    query: str
    params: pa.Table | None = None
    used: float = field(default_factory=time.monotonic)


class FlightSqlServer(flight.FlightServerBase):
    def __init__(
        self,
        location: str,
        session: Session,
        credentials: Credentials | None = None,
        tls: tuple[bytes, bytes] | None = None,
        idle_timeout_s: float = 600.0,
        spill_bytes: int = SPILL_BYTES,
        config: Config | None = None,
    ):
        """``config``: its ``serve_parts_min_bytes`` and ``serve_part_timeout_s`` (parts.py);
        the environment's when None."""
        kwargs: dict[str, object] = {}
        if tls is not None:
            kwargs["tls_certificates"] = [flight.CertKeyPair(cert=tls[0], key=tls[1])]
        if credentials is not None:
            kwargs["auth_handler"] = NoHandshake()
            kwargs["middleware"] = {"auth": AuthMiddleware(credentials)}
        super().__init__(location, **kwargs)
        self.session = session
        self.idle_timeout_s = idle_timeout_s
        self._lock = threading.Lock()
        self._query_turn = threading.Lock()
        self._stopping = threading.Event()
        self.results = ResultStore(idle_timeout_s, spill_bytes)
        config = config or Config.from_env()
        self.credentials = credentials
        self.parts_min_bytes = config.serve_parts_min_bytes
        self._tls_root = tls[0] if tls is not None else None  # to fetch a small result's parts
        self._serving = parts.PartServing(
            handle="",
            secret=secrets.token_hex(32),
            host=urlparse(location).hostname or "127.0.0.1",
            timeout_s=config.serve_part_timeout_s,
            token=credentials.token if credentials else None,
            username=credentials.username if credentials else None,
            password=credentials.password if credentials else None,
            signing_key=credentials.signing_key.hex() if credentials else "",
            tls_cert=tls[0].decode() if tls else None,
            tls_key=tls[1].decode() if tls else None,
        )
        self._prepared: dict[bytes, _Prepared] = {}
        self._answers: dict[str, Callable[[_Call, Any], pa.Table | _Parts]] = {
            "CommandStatementQuery": lambda call, m: self._run([m.query], call),
            "CommandPreparedStatementQuery": self._run_prepared,
            "CommandGetSqlInfo": lambda _, m: sql_info.sql_info(m.info),
            "CommandGetCatalogs": lambda _, m: metadata.catalogs(),
            "CommandGetDbSchemas": lambda _, m: metadata.db_schemas(
                _opt(m, "catalog"), _opt(m, "db_schema_filter_pattern")
            ),
            "CommandGetTables": lambda call, m: self._tables(m, call),
            "CommandGetTableTypes": lambda _, m: metadata.table_types(),
            "CommandGetXdbcTypeInfo": lambda _, m: metadata.xdbc_type_info(_opt(m, "data_type")),
            "CommandGetPrimaryKeys": lambda _, m: metadata.PRIMARY_KEYS.empty_table(),
            **dict.fromkeys(
                ("CommandGetExportedKeys", "CommandGetImportedKeys", "CommandGetCrossReference"),
                lambda _, m: metadata.FOREIGN_KEYS.empty_table(),
            ),
        }

    # --- Flight calls -----------------------------------------------------------------------

    def get_flight_info(self, context, descriptor):
        caller = _caller(context)
        name, message = self._command(descriptor)
        table = _refusing(lambda: self._answers[name](_Call(caller, context.is_cancelled), message))
        if isinstance(table, _Parts):
            return self._endpoints(table, caller, descriptor)
        handle = self.results.put(caller, table)
        ticket = flight.Ticket(protocol.pack(protocol.new("TicketStatementQuery", statement_handle=handle)))
        endpoint = flight.FlightEndpoint(ticket, [])
        return flight.FlightInfo(table.schema, descriptor, [endpoint], table.num_rows, -1)

    def _endpoints(self, held: _Parts, caller: str, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        """One endpoint per rank holding a part: its own location, a ticket for this principal."""
        principal = parts.principal_of(self.credentials, caller)
        endpoints = [
            flight.FlightEndpoint(parts.ticket(held.serving, p.rank, principal), [p.location])
            for p in held.held
        ]
        rows, nbytes = sum(p.rows for p in held.held), sum(p.nbytes for p in held.held)
        return flight.FlightInfo(held.schema, descriptor, endpoints, rows, nbytes)

    def get_schema(self, context, descriptor):
        caller = _caller(context)
        name, message = self._command(descriptor)
        if name == "CommandStatementQuery":
            schema = _refusing(lambda: self._planned_schema(message.query))
            return flight.SchemaResult(schema)
        if name == "CommandPreparedStatementQuery":
            statement = self._statement(caller, message)
            schema = _refusing(lambda: self._planned_schema(params.bind_nulls(statement.query)))
            return flight.SchemaResult(schema)
        # A metadata command's schema is fixed; its answer is cheap: take the schema from it.
        answer = _refusing(lambda: self._answers[name](_Call(caller, context.is_cancelled), message))
        return flight.SchemaResult(answer.schema)  # a table: only a query's result comes in parts

    def do_get(self, context, ticket):
        caller = _caller(context)
        name, message = _unpacked(ticket.ticket)
        if name != "TicketStatementQuery":
            raise pa.ArrowInvalid(f"{PREFIX}a ticket must be a TicketStatementQuery, not {name}")
        try:
            return self.results.take(caller, message.statement_handle)
        except KeyError as e:
            raise KeyError(f"{PREFIX}{e.args[0]}") from None

    def do_put(self, context, descriptor, reader, writer):
        caller = _caller(context)
        name, message = self._command(descriptor)
        if name != "CommandPreparedStatementQuery":
            raise NotImplementedError(f"{PREFIX}DoPut takes a prepared statement's parameters, not {name}")
        statement = self._statement(caller, message)
        bound = reader.read_all()
        _refusing(lambda: params.check_count(statement.query, bound.num_columns))
        statement.params = bound

    def do_action(self, context, action):
        caller = _caller(context)
        if action.type == CREATE_PREPARED:
            request = _body(action, "ActionCreatePreparedStatementRequest")
            prepared = self._prepare(_Call(caller, context.is_cancelled), request.query)
            return [flight.Result(protocol.pack(prepared))]
        if action.type == CANCEL_FLIGHT_INFO:
            return [flight.Result(self._cancel(caller, action.body.to_pybytes()))]
        if action.type == CLOSE_PREPARED:
            request = _body(action, "ActionClosePreparedStatementRequest")
            with self._lock:
                statement = self._prepared.get(request.prepared_statement_handle)
                if statement is not None and statement.owner == caller:
                    del self._prepared[request.prepared_statement_handle]
            return []
        raise NotImplementedError(
            f"{PREFIX}action {action.type!r} is not offered (read-only, no transactions)"
        )

    def list_actions(self, context):
        return [
            flight.ActionType(CREATE_PREPARED, "prepare a query with ? parameters"),
            flight.ActionType(CLOSE_PREPARED, "close a prepared statement"),
            flight.ActionType(CANCEL_FLIGHT_INFO, "drop a query's result before it is fetched"),
        ]

    def list_flights(self, context, criteria):
        return iter(())

    @property
    def busy(self) -> bool:
        """Whether a query runs on the session now."""
        return self._query_turn.locked()

    def stop(self) -> None:
        """Stop serving: the running query is interrupted on every rank, queries waiting their turn
        are refused, and the calls under way end before this returns."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self.shutdown()
        self.results.close()

    # --- answers ------------------------------------------------------------------------------

    def _command(self, descriptor: flight.FlightDescriptor) -> tuple[str, Any]:
        if descriptor.descriptor_type != flight.DescriptorType.CMD:
            raise pa.ArrowInvalid(f"{PREFIX}a Flight SQL command descriptor is expected, not a path")
        name, message = _unpacked(descriptor.command)
        if name in protocol.WRITE_COMMANDS:
            raise pa.ArrowInvalid(f"{PREFIX}{name} refused: the server is read-only")
        if name not in self._answers:
            raise NotImplementedError(f"{PREFIX}the Flight SQL command {name} is not supported")
        return name, message

    def _run(self, queries: list[str], call: _Call) -> pa.Table | _Parts:
        """The result of each query (one per row of a prepared statement's parameters), appended;
        one query's large unordered result left in parts on the ranks."""
        if len(queries) == 1 and self.parts_min_bytes >= 0:
            return self._run_in_parts(queries[0], call)
        tables = []
        for query in queries:
            result = self._run_one(query, call.gone)
            table, types = result.arrow(), result.outcome.plan.output_types
            tables.append(table.cast(metadata.with_type_names(table.schema, types)))
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    def _run_in_parts(self, query: str, call: _Call) -> pa.Table | _Parts:
        """``query``'s result; where the ranks hold it in parts (unordered, no LIMIT) and it is
        large, left there. A small one is fetched from the ranks, to come from one endpoint."""
        serving = replace(self._serving, handle=secrets.token_hex(16))
        result = self._run_one(query, call.gone, serving)
        plan = result.outcome.plan
        schema = metadata.with_type_names(plan.output_schema, plan.output_types)
        held = result.outcome.parts
        if not held:
            return result.arrow().cast(schema)
        if sum(p.nbytes for p in held) >= self.parts_min_bytes:
            return _Parts(schema, held, serving)
        return parts.fetch(held, serving, self._tls_root).cast(schema)

    def _run_one(
        self, query: str, gone: Callable[[], bool], serving: parts.PartServing | None = None
    ) -> Result:
        """``query`` on the session, stopped on every rank once ``gone()`` (its client has gone, so
        its ranks are free for others'). Queries run one at a time here, so that what the watch
        interrupts is this query; the watch has ended before the next one starts."""
        with self._query_turn:
            if self._stopping.is_set():
                raise flight.FlightUnavailableError(f"{PREFIX}the server is stopping")
            stop = threading.Event()

            def watch() -> None:
                while not stop.wait(GONE_POLL_S):
                    if gone() or self._stopping.is_set():
                        # Again at each look: the session may not have begun the query at the first
                        # (waiting for a metadata call's plan), and an interrupt then does nothing.
                        self.session.interrupt()

            watcher = threading.Thread(target=watch, name="duckflock-serve-watch", daemon=True)
            watcher.start()
            try:
                return self.session.sql(query, serve_parts=serving)
            except QueryCancelled:
                if self._stopping.is_set():
                    raise flight.FlightUnavailableError(f"{PREFIX}the server is stopping") from None
                raise
            finally:
                stop.set()
                watcher.join()

    def _run_prepared(self, call: _Call, message: Any) -> pa.Table:
        statement = self._statement(call.caller, message)
        spots = params.placeholders(statement.query)
        if statement.params is None:
            if spots:
                raise DuckflockError(f"the statement has {len(spots)} parameters (?) and none were bound")
            return self._run([statement.query], call)
        if statement.params.num_rows == 0:
            raise DuckflockError("no parameter values were bound (an empty batch)")
        return self._run(params.bind(statement.query, statement.params), call)

    def _prepare(self, call: _Call, query: str) -> Any:
        spots = _refusing(lambda: params.placeholders(query))
        dataset = parameters = b""
        if spots:  # the result's types may depend on the values': told when it runs
            types = params.parameter_types(query, self._column_types(call))
            parameters = params.parameter_schema(types).serialize().to_pybytes()
        else:
            schema = _refusing(lambda: self._planned_schema(query))
            dataset = schema.serialize().to_pybytes()
        handle = secrets.token_bytes(16)
        with self._lock:
            self._drop_idle()
            self._prepared[handle] = _Prepared(call.caller, query)
        return protocol.new(
            "ActionCreatePreparedStatementResult",
            prepared_statement_handle=handle,
            dataset_schema=dataset,
            parameter_schema=parameters,
        )

    def _cancel(self, caller: str, body: bytes) -> bytes:
        """CancelFlightInfo: a query has run by the time its client holds the FlightInfo (GetFlightInfo
        answers once it has), so what is left to cancel is its result, which is dropped. Status
        cancelled; unspecified where the result was not held (fetched, timed out, or not yours)."""
        try:
            request = protocol.parse("CancelFlightInfoRequest", body)
            info = flight.FlightInfo.deserialize(request.info)
        except (protocol.BadMessage, pa.ArrowException):
            raise pa.ArrowInvalid(f"{PREFIX}not a CancelFlightInfoRequest") from None
        dropped = False
        principal = parts.principal_of(self.credentials, caller)
        for endpoint in info.endpoints:
            raw = endpoint.ticket.ticket
            if parts.is_part_ticket(raw) and endpoint.locations:  # a rank's part
                if parts.signed_for(self._serving.secret, raw, principal):
                    location = endpoint.locations[0].uri.decode()
                    dropped |= parts.drop(location, raw, self._serving, self._tls_root)
                continue
            name, ticket = _unpacked(raw)
            if name == "TicketStatementQuery":
                dropped |= self.results.drop(caller, ticket.statement_handle)
        status = CANCEL_STATUS["cancelled" if dropped else "unspecified"]
        return protocol.new("CancelFlightInfoResult", status=status).SerializeToString()

    def _statement(self, caller: str, message: Any) -> _Prepared:
        with self._lock:
            statement = self._prepared.get(message.prepared_statement_handle)
        if statement is None or statement.owner != caller:
            raise KeyError(f"{PREFIX}no such prepared statement (closed, idle too long, or not yours)")
        statement.used = time.monotonic()
        return statement

    def _table_names(self, call: _Call) -> list[str]:
        """The session's tables, asked each time (tables loaded meanwhile are listed), of the
        session itself: its ranks may be Flight workers, whose data directory is not here."""
        return self._run_one("SHOW TABLES", call.gone).arrow().column(0).to_pylist()

    def _tables(self, m: Any, call: _Call) -> pa.Table:
        schema_of = self._table_schema if m.include_schema else None
        return metadata.tables(
            self._table_names(call),
            _opt(m, "catalog"),
            _opt(m, "db_schema_filter_pattern"),
            _opt(m, "table_name_filter_pattern"),
            list(m.table_types),
            schema_of,
        )

    def _column_types(self, call: _Call) -> dict[str, str]:
        """Lower-case column name -> its type, over the session's tables (names of two types left out)."""
        seen: dict[str, set[str]] = {}
        for table in self._table_names(call):
            schema, types = self.session.schema(f"SELECT * FROM {q(table)}")
            for name, kind in zip(schema.names, types, strict=False):  # no types: none known
                seen.setdefault(name.lower(), set()).add(kind)
        return {name: kinds.pop() for name, kinds in seen.items() if len(kinds) == 1}

    def _table_schema(self, name: str) -> pa.Schema:
        return self._planned_schema(f"SELECT * FROM {q(name)}")

    def _planned_schema(self, query: str) -> pa.Schema:
        """The schema of ``query``'s result, from its plan (nothing runs), as its rows will have it."""
        schema, types = self.session.schema(query)
        return metadata.with_type_names(schema, types)

    def _drop_idle(self) -> None:
        """Forget the prepared statements left idle too long (holding the lock)."""
        oldest = time.monotonic() - self.idle_timeout_s
        for handle in [h for h, item in self._prepared.items() if item.used < oldest]:
            del self._prepared[handle]


def _caller(context) -> str:
    """The call's identity (its bearer token); "" where the server takes every caller."""
    middleware = context.get_middleware("auth")
    return middleware.identity if isinstance(middleware, CallerMiddleware) else ""


def _unpacked(data: bytes) -> tuple[str, Any]:
    try:
        name, message = protocol.unpack(data)
    except protocol.BadMessage as e:
        raise pa.ArrowInvalid(f"{PREFIX}{e}") from None
    if message is None:
        raise NotImplementedError(f"{PREFIX}the Flight SQL message {name} is not supported")
    return name, message


def _body(action: flight.Action, expected: str) -> Any:
    name, message = _unpacked(action.body.to_pybytes())
    if name != expected:
        raise pa.ArrowInvalid(f"{PREFIX}action {action.type} takes a {expected}, not a {name}")
    return message


def _opt(message: Any, name: str) -> Any:
    """An optional field's value, None when unset."""
    return getattr(message, name) if message.HasField(name) else None


def _refusing(answer: Callable[[], T]) -> T:
    """``answer()``; duckflock's refusal of a query (an SQL error, a statement that writes) as
    INVALID_ARGUMENT with its message."""
    try:
        return answer()
    except DuckflockError as e:
        raise pa.ArrowInvalid(f"{PREFIX}{e}") from None
