"""``duckflock serve`` (flightsql/): real Flight SQL clients (ADBC's Go driver, pyarrow's Flight
client) against the server over thread ranks, every answer compared with single-process DuckDB."""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from decimal import Decimal

import adbc_driver_manager
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from adbc_driver_flightsql import DatabaseOptions

from duckflock.flightsql import metadata, protocol, sql_info
from duckflock.flightsql.auth import Credentials
from duckflock.testing.tpch import ORDER, queries
from serve_support import CALL_TIMEOUT_S, ENDLESS, connect, fetch, self_signed, served, serving, statement
from support import assert_same, oracle

pytestmark = pytest.mark.timeout(300)

QUERIES = [
    "SELECT n_name, r_name FROM nation JOIN region ON n_regionkey = r_regionkey",
    "SELECT l_returnflag, sum(l_quantity) AS q, avg(l_extendedprice) AS p FROM lineitem GROUP BY 1",
    "SELECT o_orderdate, o_totalprice FROM orders ORDER BY o_totalprice DESC, o_orderkey LIMIT 7",
    "SELECT count(*) AS n FROM lineitem WHERE l_shipdate > DATE '1995-01-01'",
]
TPCH_TABLES = ["customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier"]


@pytest.fixture(scope="module")
def server(tpch_dir):
    with served(tpch_dir) as uri:
        yield uri


def raw_client(uri: str) -> flight.FlightClient:
    return flight.FlightClient(uri.replace("grpc://", "grpc+tcp://"))


OPTIONS = flight.FlightCallOptions(timeout=CALL_TIMEOUT_S)


def command(client: flight.FlightClient, message) -> pa.Table:
    """A Flight SQL command's answer: GetFlightInfo, then DoGet of its one endpoint."""
    descriptor = flight.FlightDescriptor.for_command(protocol.pack(message))
    info = client.get_flight_info(descriptor, OPTIONS)
    (endpoint,) = info.endpoints
    return client.do_get(endpoint.ticket, OPTIONS).read_all()


def test_queries_through_adbc_match_duckdb(server, tpch_dir):
    ref = oracle(tpch_dir)
    for sql in QUERIES:
        assert_same(fetch(server, sql), ref.sql(sql).to_arrow_table())


def test_prepared_statement_binds_parameters(server, tpch_dir):
    ref = oracle(tpch_dir)
    sql = (
        "SELECT o_orderkey, o_totalprice FROM orders WHERE o_custkey = ? AND o_orderdate >= ? "
        "AND o_totalprice > ? AND o_orderpriority <> ? AND o_comment <> '?'"
    )
    with connect(server) as conn, conn.cursor() as cur:
        for custkey in (1, 4, 7):  # one statement, bound again each time
            values = (custkey, dt.date(1994, 1, 1), Decimal("1000.50"), "1-URGENT")
            cur.execute(sql, values)
            got = cur.fetch_arrow_table()
            assert_same(got, ref.sql(sql, params=list(values)).to_arrow_table())
        cur.execute("SELECT ? IS NULL AS missing, ? AS s", (None, "it's"))
        assert cur.fetchall() == [(True, "it's")]
        with pytest.raises(
            adbc_driver_manager.ProgrammingError,
            match=r"the query has 1 parameter \(\?\), 2 values were bound",
        ):
            cur.execute("SELECT ? AS a", (1, 2))
    with connect(server) as conn, conn.cursor() as cur:  # no parameters: still a prepared statement
        cur.execute("SELECT 'a?b' AS s -- ?")
        assert cur.fetchall() == [("a?b",)]


def test_get_objects_and_table_schema_name_the_catalogs_tables(server, tpch_dir):
    ref = oracle(tpch_dir)
    with connect(server) as conn:
        (catalog,) = conn.adbc_get_objects().read_all().to_pylist()
        assert catalog["catalog_name"] == metadata.CATALOG
        (schema,) = catalog["catalog_db_schemas"]
        tables = {t["table_name"]: t for t in schema["db_schema_tables"]}
        assert sorted(tables) == TPCH_TABLES
        columns = [(c["column_name"], c["xdbc_type_name"]) for c in tables["orders"]["table_columns"]]
        assert columns == ref.sql("SELECT column_name, column_type FROM (DESCRIBE orders)").fetchall()
        got = conn.adbc_get_table_schema("lineitem")
        want = ref.sql("SELECT * FROM lineitem LIMIT 0").to_arrow_table().schema
        assert got.remove_metadata() == want.remove_metadata()
        assert [f.metadata[b"ARROW:FLIGHT:SQL:TYPE_NAME"] for f in got][:2] == [b"BIGINT", b"BIGINT"]
        assert conn.adbc_get_table_types() == ["TABLE"]
        info = conn.adbc_get_info()
        assert info["vendor_name"] == "duckflock"


def test_metadata_commands_answer_in_the_specifications_schemas(server):
    client = raw_client(server)
    tables = command(client, protocol.new("CommandGetTables", table_name_filter_pattern="%part%"))
    assert tables.schema == metadata.TABLES
    assert tables.column("table_name").to_pylist() == ["part", "partsupp"]
    with_schema = command(client, protocol.new("CommandGetTables", include_schema=True, catalog="nope"))
    assert with_schema.schema == metadata.TABLES_WITH_SCHEMA and with_schema.num_rows == 0
    nation = command(
        client, protocol.new("CommandGetTables", include_schema=True, table_name_filter_pattern="n_tion")
    )
    schema = pa.ipc.read_schema(pa.py_buffer(nation.column("table_schema")[0].as_py()))
    assert schema.names == ["n_nationkey", "n_name", "n_regionkey", "n_comment"]
    assert command(client, protocol.new("CommandGetCatalogs")).to_pylist() == [{"catalog_name": "duckflock"}]
    query = protocol.new("CommandStatementQuery", query=QUERIES[1])
    planned = client.get_schema(flight.FlightDescriptor.for_command(protocol.pack(query)), OPTIONS).schema
    assert planned == command(client, query).schema  # from the plan: nothing runs
    schemas = command(client, protocol.new("CommandGetDbSchemas", db_schema_filter_pattern="ma%"))
    assert schemas.to_pylist() == [{"catalog_name": "duckflock", "db_schema_name": "main"}]
    assert command(client, protocol.new("CommandGetTableTypes")).to_pylist() == [{"table_type": "TABLE"}]
    info = command(client, protocol.new("CommandGetSqlInfo", info=[0, 3, 504, 99999]))
    assert info.schema == sql_info.SCHEMA
    assert [(r["info_name"], r["value"]) for r in info.to_pylist()] == [
        (0, "duckflock"),
        (3, True),
        (504, '"'),
    ]
    every = command(client, protocol.new("CommandGetSqlInfo")).column("info_name").to_pylist()
    assert set(range(500, 577)) <= set(every)  # each SQL syntax code: JDBC fails on one left out
    types = command(client, protocol.new("CommandGetXdbcTypeInfo"))
    assert types.schema == metadata.XDBC_TYPE_INFO
    assert types.column("data_type").to_pylist() == sorted(types.column("data_type").to_pylist())
    assert command(client, protocol.new("CommandGetXdbcTypeInfo", data_type=4)).column(
        "type_name"
    ).to_pylist() == ["INTEGER"]
    assert (
        command(client, protocol.new("CommandGetPrimaryKeys", table="orders")).schema == metadata.PRIMARY_KEYS
    )
    for name in ("CommandGetExportedKeys", "CommandGetImportedKeys"):
        keys = command(client, protocol.new(name, table="orders"))
        assert keys.schema == metadata.FOREIGN_KEYS and keys.num_rows == 0


def _any(type_name: str, value: bytes = b"") -> bytes:
    from google.protobuf import any_pb2

    return any_pb2.Any(type_url=f"type.googleapis.com/{type_name}", value=value).SerializeToString()


def test_bad_inputs_are_refused_with_a_status_and_the_server_goes_on(server, tpch_dir):
    client = raw_client(server)

    def info(command_bytes: bytes):
        return client.get_flight_info(flight.FlightDescriptor.for_command(command_bytes), OPTIONS)

    with pytest.raises(pa.ArrowInvalid, match="not a Flight SQL command"):
        info(b"\xff\xfe not protobuf")
    with pytest.raises(pa.ArrowInvalid, match="not a Flight SQL command"):
        info(_any("google.protobuf.Empty"))
    with pytest.raises(pa.ArrowInvalid, match="malformed CommandStatementQuery"):
        info(_any(f"{protocol.PACKAGE}.CommandStatementQuery", b"\x0a\xff"))
    with pytest.raises(pa.ArrowNotImplementedError, match="CommandStatementSubstraitPlan is not supported"):
        info(_any(f"{protocol.PACKAGE}.CommandStatementSubstraitPlan"))
    with pytest.raises(pa.ArrowInvalid, match="CommandStatementUpdate refused: the server is read-only"):
        info(protocol.pack(protocol.new("CommandStatementUpdate", query="DELETE FROM nation")))
    with pytest.raises(pa.ArrowNotImplementedError, match="'BeginTransaction' is not offered"):
        list(client.do_action(flight.Action("BeginTransaction", b""), OPTIONS))
    with pytest.raises(pa.ArrowInvalid, match="a path"):
        client.get_flight_info(flight.FlightDescriptor.for_path("orders"), OPTIONS)
    with pytest.raises(KeyError, match="no result for this ticket"):
        bogus = protocol.new("TicketStatementQuery", statement_handle=b"0" * 16)
        client.do_get(flight.Ticket(protocol.pack(bogus)), OPTIONS).read_all()
    sql = protocol.new("CommandStatementQuery", query="SELECT count(*) AS n FROM region")
    ticket = info(protocol.pack(sql)).endpoints[0].ticket
    assert client.do_get(ticket, OPTIONS).read_all().to_pylist() == [{"n": 5}]
    with pytest.raises(KeyError, match="fetched already, timed out"):  # a ticket is good for one fetch
        client.do_get(ticket, OPTIONS).read_all()
    with connect(server) as conn, conn.cursor() as cur:
        for sql, message in [
            ("SELEC 1", "syntax error"),
            ("SELECT * FROM nosuch", "nosuch"),
            ("COPY (SELECT 1) TO 'x.csv'", "only SELECT, DESCRIBE and SHOW TABLES are supported, not COPY"),
            ("INSERT INTO nation VALUES (1, 'a', 1, 'b')", "not INSERT"),
            ("CREATE TABLE t AS SELECT 1", "not CREATE"),
            ("ATTACH 'other.db'", "not ATTACH"),
            ("INSTALL httpfs", "not INSTALL"),
            ("SET temp_directory = '/'", "not SET"),
            ("SELECT * FROM read_text('/etc/hostname')", "Permission Error"),
        ]:
            with pytest.raises(adbc_driver_manager.ProgrammingError, match=message) as refused:
                cur.execute(sql)
            assert "INVALID_ARGUMENT" in str(refused.value)
    assert_same(fetch(server, QUERIES[0]), oracle(tpch_dir).sql(QUERIES[0]).to_arrow_table())


def test_token_and_password_logins(tpch_dir):
    token = "t" * 24
    credentials = Credentials(token, "ana", "s3cret-pass!")
    with served(tpch_dir, credentials=credentials) as uri:
        bearer = {DatabaseOptions.AUTHORIZATION_HEADER.value: f"Bearer {token}"}
        assert fetch_with(uri, bearer) == [{"n": 25}]
        assert fetch_with(uri, {"username": "ana", "password": "s3cret-pass!"}) == [{"n": 25}]
        for wrong in (
            {DatabaseOptions.AUTHORIZATION_HEADER.value: "Bearer not-the-token"},
            {"username": "ana", "password": "wrong"},
            {},
        ):
            with pytest.raises(
                adbc_driver_manager.Error, match=r"UNAUTHENTICATED: .*invalid or missing credentials"
            ):
                fetch_with(uri, wrong)
        # Two logins are two callers: one's ticket is no good to the other.
        first, second = raw_client(uri), raw_client(uri)
        a = first.authenticate_basic_token("ana", "s3cret-pass!", OPTIONS)
        b = second.authenticate_basic_token("ana", "s3cret-pass!", OPTIONS)
        assert a != b
        as_a = flight.FlightCallOptions(headers=[a], timeout=CALL_TIMEOUT_S)
        as_b = flight.FlightCallOptions(headers=[b], timeout=CALL_TIMEOUT_S)
        ticket = first.get_flight_info(statement("SELECT 1 AS one"), as_a).endpoints[0].ticket
        with pytest.raises(KeyError, match="not yours"):
            second.do_get(ticket, as_b).read_all()
        assert first.do_get(ticket, as_a).read_all().to_pylist() == [{"one": 1}]


def fetch_with(uri: str, options: dict[str, str]) -> list[dict]:
    return fetch(uri, "SELECT count(*) AS n FROM nation", **options).to_pylist()


def test_tls_with_a_given_certificate(tpch_dir, tmp_path):
    cert, key = self_signed(tmp_path)
    with served(tpch_dir, tls=(cert, key)) as uri:
        assert fetch_with(uri, {DatabaseOptions.TLS_ROOT_CERTS.value: cert.decode()}) == [{"n": 25}]
        with pytest.raises(adbc_driver_manager.Error, match="failed to verify certificate"):
            fetch_with(uri, {})  # the server's certificate is not trusted
        with pytest.raises(adbc_driver_manager.Error, match=r"\(Unavailable;"):
            fetch_with(uri.replace("grpc+tls://", "grpc://"), {})  # plaintext to a TLS port


def test_two_clients_at_once_each_get_their_answer(server, tpch_dir):
    ref = oracle(tpch_dir)
    want = {sql: ref.sql(sql).to_arrow_table() for sql in QUERIES}
    problems: list[str] = []

    def client(order: list[str]) -> None:
        try:
            with connect(server) as conn, conn.cursor() as cur:
                for sql in order * 2:
                    cur.execute(sql)
                    assert_same(cur.fetch_arrow_table(), want[sql])
        except Exception as e:  # reported by the test's thread
            problems.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(o,)) for o in (QUERIES, QUERIES[::-1])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not any(t.is_alive() for t in threads), "a client did not finish"
    assert not problems, problems


def test_tpch_22_through_adbc_match_duckdb(server, tpch_dir):
    ref = oracle(tpch_dir)
    failures = []
    with connect(server) as conn, conn.cursor() as cur:
        for n, sql in queries().items():
            cur.execute(sql)
            try:
                assert_same(cur.fetch_arrow_table(), ref.sql(sql).to_arrow_table(), ORDER.get(n))
            except AssertionError as e:
                failures.append(f"Q{n}: {str(e)[:300]}")
    assert not failures, "\n".join(failures)


def test_dropped_connections_and_an_abandoned_stream_leave_the_server_serving(server, tpch_dir):
    small = statement("SELECT * FROM region")
    for i in range(100):  # half of them ask for a result and never fetch it
        client = raw_client(server)
        if i % 2:
            client.get_flight_info(small, OPTIONS)
        client.close()
    client = raw_client(server)
    info = client.get_flight_info(statement("SELECT * FROM lineitem"), OPTIONS)
    reader = client.do_get(info.endpoints[0].ticket, OPTIONS)
    reader.read_chunk()  # the first batch of many, then the client goes away
    client.close()
    assert_same(fetch(server, QUERIES[1]), oracle(tpch_dir).sql(QUERIES[1]).to_arrow_table())


def test_a_query_whose_client_has_gone_stops_and_frees_the_ranks(server, tpch_dir):
    with pytest.raises(flight.FlightTimedOutError):
        raw_client(server).get_flight_info(statement(ENDLESS), flight.FlightCallOptions(timeout=2))
    assert_same(fetch(server, QUERIES[0]), oracle(tpch_dir).sql(QUERIES[0]).to_arrow_table())


def test_results_and_prepared_statements_left_idle_are_dropped(tpch_dir):
    with served(tpch_dir, idle_timeout_s=0) as uri:  # whatever was made before is idle too long
        client = raw_client(uri)

        first = client.get_flight_info(statement("SELECT 1 AS x"), OPTIONS)
        second = client.get_flight_info(statement("SELECT 2 AS x"), OPTIONS)
        with pytest.raises(KeyError, match="timed out"):
            client.do_get(first.endpoints[0].ticket, OPTIONS).read_all()
        assert client.do_get(second.endpoints[0].ticket, OPTIONS).read_all().to_pylist() == [{"x": 2}]
        with connect(uri) as conn, conn.cursor() as one, conn.cursor() as other:
            one.adbc_prepare("SELECT 1 AS x")
            other.adbc_prepare("SELECT 2 AS x")
            with pytest.raises(adbc_driver_manager.Error, match="idle too long"):
                one.execute("SELECT 1 AS x")


def test_stopping_the_server_interrupts_the_running_query(tpch_dir):
    with serving(tpch_dir) as server:
        failed: list[Exception] = []

        def client() -> None:
            try:
                raw_client(f"grpc://127.0.0.1:{server.port}").get_flight_info(statement(ENDLESS), OPTIONS)
            except Exception as e:  # checked below
                failed.append(e)

        thread = threading.Thread(target=client)
        thread.start()
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while not server.busy and time.monotonic() < deadline:
            time.sleep(0.05)  # until the query runs (not a race: the stop below is checked either way)
        server.stop()
        thread.join(CALL_TIMEOUT_S)
        assert not thread.is_alive(), "the query went on after the server stopped"
        assert [type(e) for e in failed] == [flight.FlightUnavailableError], failed
        assert "the server is stopping" in str(failed[0])


def test_a_large_result_waits_on_disk_and_is_removed_once_fetched(tpch_dir):
    with serving(tpch_dir, spill_bytes=1 << 20) as server:
        client = raw_client(f"grpc://127.0.0.1:{server.port}")
        small = client.get_flight_info(statement("SELECT * FROM nation"), OPTIONS)
        assert server.results.files == []  # in memory
        large = client.get_flight_info(statement("SELECT * FROM lineitem"), OPTIONS)
        assert len(server.results.files) == 1  # on disk
        got = client.do_get(large.endpoints[0].ticket, OPTIONS).read_all()
        assert server.results.files == []  # removed as the stream opened it
        assert_same(got, oracle(tpch_dir).sql("SELECT * FROM lineitem").to_arrow_table())
        assert client.do_get(small.endpoints[0].ticket, OPTIONS).read_all().num_rows == 25
        client.get_flight_info(statement("SELECT * FROM lineitem"), OPTIONS)  # never fetched
        assert len(server.results.files) == 1
        directory = server.results.directory
    assert directory is not None and not os.path.exists(directory)  # the server's stop removed it


def test_a_prepared_statement_bound_with_several_rows_answers_each_in_turn(server, tpch_dir):
    """The specification's DoPut of a batch of parameter sets, through pyarrow's Flight client."""
    client = raw_client(server)
    sql = "SELECT n_name FROM nation WHERE n_nationkey = ?"
    request = protocol.new("ActionCreatePreparedStatementRequest", query=sql)
    (answer,) = client.do_action(flight.Action("CreatePreparedStatement", protocol.pack(request)), OPTIONS)
    name, prepared = protocol.unpack(answer.body.to_pybytes())
    assert name == "ActionCreatePreparedStatementResult"
    assert pa.ipc.read_schema(pa.py_buffer(prepared.parameter_schema)).types == [pa.int64()]
    handle = prepared.prepared_statement_handle
    command = flight.FlightDescriptor.for_command(
        protocol.pack(protocol.new("CommandPreparedStatementQuery", prepared_statement_handle=handle))
    )
    values = pa.table({"1": pa.array([3, 1, 24], pa.int64())})
    writer, _ = client.do_put(command, values.schema, OPTIONS)
    writer.write_table(values)
    writer.close()
    info = client.get_flight_info(command, OPTIONS)
    got = client.do_get(info.endpoints[0].ticket, OPTIONS).read_all()
    names = dict(oracle(tpch_dir).sql("SELECT n_nationkey, n_name FROM nation").fetchall())
    assert got.column("n_name").to_pylist() == [names[k] for k in (3, 1, 24)]  # each row's answer in turn
    close = protocol.new("ActionClosePreparedStatementRequest", prepared_statement_handle=handle)
    assert (
        list(client.do_action(flight.Action("ClosePreparedStatement", protocol.pack(close)), OPTIONS)) == []
    )
    with pytest.raises(KeyError, match="no such prepared statement"):
        client.get_flight_info(command, OPTIONS)


def test_cancel_flight_info_drops_the_result_before_it_is_fetched(server):
    client = raw_client(server)
    info = client.get_flight_info(statement("SELECT * FROM nation"), OPTIONS)
    request = protocol.new("CancelFlightInfoRequest", info=info.serialize()).SerializeToString()

    def cancel(body: bytes) -> int:
        (answer,) = client.do_action(flight.Action("CancelFlightInfo", body), OPTIONS)
        return protocol.parse("CancelFlightInfoResult", answer.body.to_pybytes()).status

    assert cancel(request) == 1  # CANCEL_STATUS_CANCELLED
    with pytest.raises(KeyError, match="no result for this ticket"):
        client.do_get(info.endpoints[0].ticket, OPTIONS).read_all()
    assert cancel(request) == 0  # unspecified: nothing held any more
    with pytest.raises(pa.ArrowInvalid, match="not a CancelFlightInfoRequest"):
        cancel(b"\x0a\x03abc")
