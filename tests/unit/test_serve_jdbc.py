"""A JDBC client of ``duckflock serve``: Apache Arrow's Flight SQL JDBC driver from Maven Central,
driven by a small Java 17 program (tests/flightsql_jdbc/JdbcClient.java) as a BI tool drives it;
every answer compared with single-process DuckDB."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from duckflock.config import Config
from duckflock.flightsql.auth import Credentials
from maven_support import maven_jars, tail
from serve_support import logged_in, served, statement
from support import oracle, wait_until

pytestmark = pytest.mark.timeout(900)

HERE = Path(__file__).resolve().parent.parent / "flightsql_jdbc"
RUN_TIMEOUT_S = 300  # a JVM compiling the program and starting the driver on two busy cores


@pytest.mark.skipif(
    shutil.which("java") is None or shutil.which("mvn") is None,
    reason="the JDBC client test needs Java 17 and Maven on PATH",
)
def test_jdbc_client_metadata_prepared_statement_and_a_large_result(tpch_dir, tmp_path, monkeypatch):
    """The large result comes from an endpoint per rank, which the driver reads, each location
    logged in to anew: every part is fetched to its end (then removed)."""
    jars = maven_jars(HERE / "pom.xml", "flightsql-jdbc", "Apache Arrow's Flight SQL JDBC driver")
    monkeypatch.setenv("DUCKFLOCK_TEMP_DIR", str(tmp_path))  # the ranks' parts are made here
    credentials = Credentials(None, "bi-tool", "its password")
    with served(tpch_dir, credentials=credentials, config=Config(serve_parts_min_bytes=0)) as uri:
        client, login = logged_in(uri, "bi-tool", "its password")
        info = client.get_flight_info(statement("SELECT l_orderkey, l_extendedprice FROM lineitem"), login)
        assert len(info.endpoints) == 2 and all(e.locations for e in info.endpoints)  # as the driver's
        url = f"jdbc:arrow-flight-sql://{uri.removeprefix('grpc://')}/?useEncryption=false"
        argv = ["java", "--add-opens=java.base/java.nio=ALL-UNNAMED", "-cp", f"{jars}/*"]
        argv += [str(HERE / "JdbcClient.java"), url, "bi-tool", "its password"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert done.returncode == 0, tail(done.stdout + done.stderr, 30)
        assert len(list(tmp_path.rglob("result-*.arrow"))) == 2  # the FlightInfo's above, never fetched
        for e in info.endpoints:  # the driver's are gone: it read every part to its end
            at, login = logged_in(e.locations[0].uri.decode(), "bi-tool", "its password")
            at.do_get(e.ticket, login).read_all()
        wait_until(lambda: not list(tmp_path.rglob("result-*.arrow")), "a part left after its fetch")
    got = dict(line.split("\t", 1) for line in done.stdout.splitlines())
    ref = oracle(tpch_dir)

    def one(sql: str) -> str:
        (row,) = ref.sql(sql).fetchall()
        return ",".join(str(v) for v in row)

    # What BI tools ask first (the driver fails on any of these the server leaves out).
    assert got["product"] == "duckflock true"  # and read-only
    assert (got["quote"], got["keywords"], got["functions"], got["nulls"]) == (
        '"',
        "true",
        "true",
        "true true",
    )
    assert got["tables"] == ",".join(sorted(t for (t,) in ref.sql("SHOW TABLES").fetchall()))
    described = ref.sql("SELECT column_name || ' ' || column_type FROM (DESCRIBE nation)").fetchall()
    assert got["columns"] == ",".join(c for (c,) in described)
    assert got["count"] == one("SELECT count(*) FROM orders")
    for region in (1, 3):
        sql = f"SELECT string_agg(n_name, ',' ORDER BY n_name) FROM nation WHERE n_regionkey = {region}"
        assert got[f"region {region}"] == one(sql)
    assert got["large"] == one(
        "SELECT count(*) || ' ' || sum(l_orderkey) || ' ' || sum(l_extendedprice) FROM lineitem"
    )
