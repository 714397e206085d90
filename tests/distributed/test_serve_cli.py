"""The ``duckflock serve`` command as a user starts it, over thread ranks and over MPI ranks, with a
real ADBC client; answers compared with single-process DuckDB."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow.flight as flight
import pytest
from adbc_driver_flightsql import DatabaseOptions

from duckflock.cli.serve import PASSWORD_ENV, TOKEN_ENV
from flight_support import Workers
from serve_support import ENDLESS, connect, fetch, serve_command, statement
from support import assert_same, oracle

TOKEN = "a-token-of-24-characters"
TPCH_TABLES = ["customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier"]
SQL = "SELECT l_returnflag, sum(l_quantity) AS q, avg(l_extendedprice) AS p FROM lineitem GROUP BY 1"


LARGE = "SELECT l_orderkey, l_linenumber, l_comment FROM lineitem"
IN_PARTS = {"DUCKFLOCK_SERVE_PARTS_MIN_BYTES": "0"}  # every unordered result in parts


def _check(uri: str, tpch_dir, **options: str) -> None:
    assert_same(fetch(uri, SQL, **options), oracle(tpch_dir).sql(SQL).to_arrow_table())


def _check_parts(uri: str, tpch_dir, ranks: int, headers: list | None = None, **options: str) -> None:
    """A large result comes from an endpoint per rank, not the server's; ADBC reads them all."""
    client = flight.FlightClient(uri.replace("grpc://", "grpc+tcp://"))
    call = flight.FlightCallOptions(headers=headers or [], timeout=60)
    info = client.get_flight_info(statement(LARGE), call)
    locations = {e.locations[0].uri.decode() for e in info.endpoints}
    assert len(locations) == ranks and uri.rsplit(":", 1)[1] not in {u.rsplit(":", 1)[1] for u in locations}
    assert_same(fetch(uri, LARGE, **options), oracle(tpch_dir).sql(LARGE).to_arrow_table())


def test_serve_over_threads_with_a_token_from_the_environment(tpch_dir, tmp_path):
    bearer = {DatabaseOptions.AUTHORIZATION_HEADER.value: f"Bearer {TOKEN}"}
    with serve_command(tpch_dir, tmp_path, ["--ranks", "3"], env={TOKEN_ENV: TOKEN}) as (uri, _):
        _check(uri, tpch_dir, **bearer)


@pytest.mark.dist
def test_serve_over_mpi_ranks_with_a_password(tpch_dir, tmp_path):
    options = ["--ranks", "2", "--transport", "mpi", "--user", "ana"]
    temp = tmp_path / "ranks"  # the ranks' temp directories, where their parts wait
    env = {PASSWORD_ENV: "pass-word", "DUCKFLOCK_TEMP_DIR": str(temp), **IN_PARTS}
    with serve_command(tpch_dir, tmp_path, options, env=env) as (uri, _):
        _check(uri, tpch_dir, username="ana", password="pass-word")
        client = flight.FlightClient(uri.replace("grpc://", "grpc+tcp://"))
        login = client.authenticate_basic_token("ana", "pass-word")
        _check_parts(uri, tpch_dir, 2, [login], username="ana", password="pass-word")
        assert len(list(temp.rglob("result-*.arrow"))) == 2  # _check_parts's FlightInfo, not fetched
        with pytest.raises(Exception, match="UNAUTHENTICATED"):
            fetch(uri, SQL, username="ana", password="wrong")
        # A client that gives up: its query stops on every MPI rank, and the next one is answered.
        client = flight.FlightClient(uri.replace("grpc://", "grpc+tcp://"))
        login = client.authenticate_basic_token("ana", "pass-word")
        with pytest.raises(flight.FlightTimedOutError):
            client.get_flight_info(statement(ENDLESS), flight.FlightCallOptions(headers=[login], timeout=2))
        _check(uri, tpch_dir, username="ana", password="pass-word")
    assert list(temp.rglob("result-*.arrow")) == []  # the stop removed them


@pytest.mark.parametrize(
    ("options", "env", "message"),
    [
        (["--listen", "0.0.0.0:0"], {}, "is reachable from other machines: give --token-file"),
        (["--tls-cert", "c.pem"], {}, "--tls-cert and --tls-key go together"),
        (["--user", "ana"], {}, "--user and $DUCKFLOCK_SERVE_PASSWORD go together"),
        ([], {TOKEN_ENV: "short"}, "too short"),
        (["--listen", "127.0.0.1"], {}, "--listen wants HOST:PORT"),
        (["--workers", "127.0.0.1:1"], {}, "--data does not go with --workers"),
    ],
)
def test_serve_refuses_bad_options_in_one_line(tpch_dir, options, env, message):
    argv = [sys.executable, "-m", "duckflock.cli.main", "serve", "--data", str(tpch_dir), *options]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert done.returncode == 1 and message in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_serve_over_flight_workers(tpch_dir, tmp_path):
    """Tables, their columns and the parameters' types come from the session (worker 0 plans):
    the server has no data directory of its own."""
    with Workers(tpch_dir, 2, tmp_path / "workers") as w:
        options = ["--workers", ",".join(w.addresses), "--workers-token-file", str(w.token_file)]
        with serve_command(None, tmp_path, options, env=IN_PARTS) as (uri, _):
            _check(uri, tpch_dir)
            _check_parts(uri, tpch_dir, 2)
            with connect(uri) as conn, conn.cursor() as cur:
                (catalog,) = conn.adbc_get_objects().read_all().to_pylist()
                tables = catalog["catalog_db_schemas"][0]["db_schema_tables"]
                assert [t["table_name"] for t in tables] == sorted(TPCH_TABLES)
                cur.execute("SELECT count(*) AS n FROM orders WHERE o_custkey = ?", (7,))
                want = oracle(tpch_dir).sql("SELECT count(*) AS n FROM orders WHERE o_custkey = 7")
                assert cur.fetchall() == want.fetchall()
