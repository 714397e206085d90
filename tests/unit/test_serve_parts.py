"""``duckflock serve`` answering a large result with an endpoint per rank (flightsql/parts.py): each
rank serves its part from its temp directory; ADBC's driver reads them all, in parallel, and gets
DuckDB's rows. Every answer compared with single-process DuckDB."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from adbc_driver_flightsql import DatabaseOptions

from duckflock.config import Config
from duckflock.flightsql import protocol
from duckflock.flightsql.auth import Credentials
from serve_support import CALL_TIMEOUT_S, fetch, logged_in, self_signed, serving, statement
from support import assert_same, oracle, wait_until

pytestmark = pytest.mark.timeout(300)

OPTIONS = flight.FlightCallOptions(timeout=CALL_TIMEOUT_S)
LARGE = "SELECT l_orderkey, l_linenumber, l_comment, l_extendedprice FROM lineitem WHERE l_quantity > 10"
IN_PARTS = Config(serve_parts_min_bytes=0)  # every result in parts, however small


@pytest.fixture
def temp_dir(tmp_path, monkeypatch) -> Path:
    """The ranks' temp directories are made here (their parts are in them)."""
    monkeypatch.setenv("DUCKFLOCK_TEMP_DIR", str(tmp_path))
    return tmp_path


def part_files(temp_dir: Path) -> list[Path]:
    return sorted(temp_dir.rglob("result-*.arrow"))


def client_of(server, tls: bool = False, **kwargs) -> flight.FlightClient:
    return flight.FlightClient(f"{'grpc+tls' if tls else 'grpc+tcp'}://127.0.0.1:{server.port}", **kwargs)


def test_adbc_reads_a_large_result_from_an_endpoint_per_rank(tpch_dir, temp_dir):
    expected = oracle(tpch_dir).sql(LARGE).to_arrow_table()
    with serving(tpch_dir, ranks=3, config=IN_PARTS) as server:
        info = client_of(server).get_flight_info(statement(LARGE), OPTIONS)
        locations = [e.locations[0].uri.decode() for e in info.endpoints]
        assert len(set(locations)) == 3 and f":{server.port}" not in " ".join(locations)
        assert info.total_records == expected.num_rows
        assert len(part_files(temp_dir)) == 3  # one per rank, in its temp directory
        parts = [flight.FlightClient(e.locations[0]).do_get(e.ticket, OPTIONS) for e in info.endpoints]
        assert_same(pa.concat_tables([p.read_all() for p in parts]), expected)
        # Each part is removed once a stream has reached its end.
        wait_until(lambda: part_files(temp_dir) == [], "parts left after their fetch")

        uri = f"grpc://127.0.0.1:{server.port}"
        assert_same(fetch(uri, LARGE), expected)
        # Unordered results of every shape (a join, an aggregate, a DISTINCT) come in parts too.
        for sql in (
            "SELECT o_orderkey, c_name FROM orders JOIN customer ON o_custkey = c_custkey",
            "SELECT l_partkey, sum(l_quantity) AS q FROM lineitem GROUP BY l_partkey",
            "SELECT DISTINCT l_suppkey FROM lineitem",
        ):
            assert_same(fetch(uri, sql), oracle(tpch_dir).sql(sql).to_arrow_table())
        wait_until(lambda: part_files(temp_dir) == [], "parts left after ADBC fetched them")


def test_ordered_limited_and_small_results_come_from_one_endpoint(tpch_dir, temp_dir):
    ordered = "SELECT l_orderkey, l_linenumber FROM lineitem ORDER BY l_orderkey DESC, l_linenumber"
    limited = "SELECT l_orderkey FROM lineitem LIMIT 5"
    small = "SELECT n_name FROM nation"
    ref = oracle(tpch_dir)
    with serving(tpch_dir, config=IN_PARTS) as server:
        client = client_of(server)
        for sql in (ordered, limited):
            (endpoint,) = client.get_flight_info(statement(sql), OPTIONS).endpoints
            assert endpoint.locations == []  # the server's own
        uri = f"grpc://127.0.0.1:{server.port}"
        assert_same(fetch(uri, ordered), ref.sql(ordered).to_arrow_table(), ["l_orderkey", "l_linenumber"])
    with serving(tpch_dir) as server:  # the default threshold: nation is far below it
        (endpoint,) = client_of(server).get_flight_info(statement(small), OPTIONS).endpoints
        assert endpoint.locations == []
        got = client_of(server).do_get(endpoint.ticket, OPTIONS).read_all()
        assert_same(got, ref.sql(small).to_arrow_table())
        assert part_files(temp_dir) == []  # fetched from the ranks by the server, so removed


def test_a_ticket_replayed_by_another_principal_is_refused(tpch_dir, temp_dir):
    token = "t" * 24
    with serving(tpch_dir, credentials=Credentials(token, "ana", "s3cret-pass!"), config=IN_PARTS) as server:
        uri = f"grpc://127.0.0.1:{server.port}"
        client, as_ana = logged_in(uri, "ana", "s3cret-pass!")
        info = client.get_flight_info(statement(LARGE), as_ana)
        endpoint = info.endpoints[0]
        rank = flight.FlightClient(endpoint.locations[0])
        with pytest.raises(flight.FlightUnauthenticatedError, match="invalid or missing credentials"):
            rank.do_get(endpoint.ticket, OPTIONS).read_all()  # no credentials at all
        as_token = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])
        with pytest.raises(flight.FlightUnauthorizedError, match="issued to another principal than 'token'"):
            rank.do_get(endpoint.ticket, as_token).read_all()
        forged = flight.Ticket(endpoint.ticket.ticket[:-1] + bytes([endpoint.ticket.ticket[-1] ^ 1]))
        with pytest.raises(flight.FlightUnauthorizedError, match="issued to another principal"):
            rank.do_get(forged, as_ana).read_all()
        # Ana gets her parts with the token the server gave her (as ADBC's driver does), or logged in
        # to a rank anew (as the JDBC driver does).
        _, rank_login = logged_in(info.endpoints[1].locations[0].uri.decode(), "ana", "s3cret-pass!")
        parts = [rank.do_get(endpoint.ticket, as_ana).read_all()]
        parts.append(
            flight.FlightClient(info.endpoints[1].locations[0])
            .do_get(info.endpoints[1].ticket, rank_login)
            .read_all()
        )
        expected = oracle(tpch_dir).sql(LARGE).to_arrow_table()
        assert_same(pa.concat_tables(parts), expected)
        assert_same(fetch(uri, LARGE, username="ana", password="s3cret-pass!"), expected)
        bearer = {DatabaseOptions.AUTHORIZATION_HEADER.value: f"Bearer {token}"}
        assert_same(fetch(uri, LARGE, **bearer), expected)


def test_an_abandoned_result_is_removed_after_the_time_out_and_at_the_stop(tpch_dir, temp_dir):
    config = Config(serve_parts_min_bytes=0, serve_part_timeout_s=1.0)
    with serving(tpch_dir, config=config) as server:
        client = client_of(server)
        info = client.get_flight_info(statement(LARGE), OPTIONS)
        assert len(part_files(temp_dir)) == 2
        wait_until(lambda: part_files(temp_dir) == [], "an unfetched part outlived its time-out")
        endpoint = info.endpoints[0]
        with pytest.raises(KeyError, match="timed out"):
            flight.FlightClient(endpoint.locations[0]).do_get(endpoint.ticket, OPTIONS).read_all()
    with serving(tpch_dir, config=IN_PARTS) as server:
        client_of(server).get_flight_info(statement(LARGE), OPTIONS)
        assert len(part_files(temp_dir)) == 2
    assert part_files(temp_dir) == []  # the server's stop removed them


def test_parts_over_tls_with_the_servers_certificate(tpch_dir, temp_dir, tmp_path):
    cert, key = self_signed(tmp_path)
    with serving(tpch_dir, tls=(cert, key), config=IN_PARTS) as server:
        info = client_of(server, tls=True, tls_root_certs=cert).get_flight_info(statement(LARGE), OPTIONS)
        assert all(e.locations[0].uri.startswith(b"grpc+tls://127.0.0.1:") for e in info.endpoints)
        uri = f"grpc+tls://127.0.0.1:{server.port}"
        got = fetch(uri, LARGE, **{DatabaseOptions.TLS_ROOT_CERTS.value: cert.decode()})
        assert_same(got, oracle(tpch_dir).sql(LARGE).to_arrow_table())


def test_cancel_flight_info_deletes_the_parts_on_the_ranks(tpch_dir, temp_dir):
    with serving(
        tpch_dir, credentials=Credentials("t" * 24, "ana", "s3cret-pass!"), config=IN_PARTS
    ) as server:
        client, as_ana = logged_in(f"grpc://127.0.0.1:{server.port}", "ana", "s3cret-pass!")
        info = client.get_flight_info(statement(LARGE), as_ana)
        request = protocol.new("CancelFlightInfoRequest", info=info.serialize()).SerializeToString()

        def cancel(options: flight.FlightCallOptions) -> int:
            (answer,) = client.do_action(flight.Action("CancelFlightInfo", request), options)
            return protocol.parse("CancelFlightInfoResult", answer.body.to_pybytes()).status

        as_token = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer " + b"t" * 24)])
        assert cancel(as_token) == 0  # another principal's: nothing dropped
        assert len(part_files(temp_dir)) == 2
        assert cancel(as_ana) == 1  # CANCEL_STATUS_CANCELLED
        assert part_files(temp_dir) == []
        endpoint = info.endpoints[0]
        with pytest.raises(KeyError, match="fetched to its end already, cancelled, or timed out"):
            flight.FlightClient(endpoint.locations[0]).do_get(endpoint.ticket, as_ana).read_all()


def test_a_failed_querys_parts_are_deleted_on_every_rank(tpch_dir, temp_dir):
    (top,) = oracle(tpch_dir).sql("SELECT max(l_orderkey) FROM lineitem").fetchall()[0]
    # Fails on the rank holding that order only: the other may have written and served its part.
    # Without the drop, the part was left on each of 3 runs here (the other rank had finished).
    failing = f"SELECT CAST(CASE WHEN l_orderkey = {top} THEN 'x' ELSE '1' END AS INTEGER) AS v FROM lineitem"
    with serving(tpch_dir, config=IN_PARTS) as server:
        with pytest.raises(pa.ArrowInvalid, match="Could not convert string 'x'"):
            client_of(server).get_flight_info(statement(failing), OPTIONS)
        wait_until(lambda: part_files(temp_dir) == [], "a failed query's part was left")
