"""A ``duckflock serve`` Flight SQL server for tests: in this process over thread ranks, or as the
real command; and a self-signed certificate for its TLS."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.flight as flight
from adbc_driver_flightsql import DatabaseOptions

from duckflock.flightsql import protocol
from duckflock.flightsql.server import FlightSqlServer, open_session
from duckflock.testing.workers import listening_address

CALL_TIMEOUT_S = 60.0  # every client call's bound: a refusal must come, not a hang
# A query that, left to run, takes far longer than any client here waits (3.6e9 row pairs x 25).
ENDLESS = (
    "SELECT count(*) FROM lineitem a, lineitem b, nation c WHERE a.l_quantity + b.l_quantity > c.n_nationkey"
)


@contextmanager
def serving(
    data: Path, ranks: int = 2, tls: tuple[bytes, bytes] | None = None, **options
) -> Iterator[FlightSqlServer]:
    """A server on a free loopback port over ``ranks`` thread ranks; ``options``: FlightSqlServer's."""
    scheme = "grpc+tls" if tls else "grpc+tcp"
    with open_session(str(data), ranks) as session:
        server = FlightSqlServer(f"{scheme}://127.0.0.1:0", session, tls=tls, **options)
        try:  # it answers from its construction on, on threads of its own
            yield server
        finally:
            server.stop()


@contextmanager
def served(data: Path, ranks: int = 2, tls: tuple[bytes, bytes] | None = None, **options) -> Iterator[str]:
    """As ``serving``, yielding the server's URI."""
    with serving(data, ranks, tls, **options) as server:
        yield f"{'grpc+tls' if tls else 'grpc'}://127.0.0.1:{server.port}"


@contextmanager
def serve_command(
    data: Path | None, tmp: Path, options: list[str], env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen]]:
    """The real ``duckflock serve`` on a free loopback port, over ``data`` (None: the options name
    workers), with ``options``; yields (its URI, the process). Interrupted (Ctrl-C) at the end, as a
    user stops it; it must have ended by then."""
    log = tmp / "serve.log"
    cmd = [sys.executable, "-m", "duckflock.cli.main", "serve", "--listen", "127.0.0.1:0"]
    cmd += ["--data", str(data)] if data is not None else []
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [*cmd, *options],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            env={**os.environ, **(env or {})},
        )
    try:
        address = listening_address(proc, time.monotonic() + 120, log, "duckflock serve")
        yield f"{'grpc+tls' if '--tls-cert' in options else 'grpc'}://{address}", proc
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=CALL_TIMEOUT_S) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def statement(sql: str) -> flight.FlightDescriptor:
    """The Flight SQL command that runs ``sql``, for pyarrow's Flight client."""
    return flight.FlightDescriptor.for_command(
        protocol.pack(protocol.new("CommandStatementQuery", query=sql))
    )


def logged_in(
    location: str, user: str, password: str
) -> tuple[flight.FlightClient, flight.FlightCallOptions]:
    """A pyarrow Flight client of ``location`` (a server or a rank's), logged in with a password,
    and the call options that carry its token."""
    client = flight.FlightClient(location.replace("grpc://", "grpc+tcp://"))
    token = client.authenticate_basic_token(user, password, flight.FlightCallOptions(timeout=CALL_TIMEOUT_S))
    return client, flight.FlightCallOptions(headers=[token], timeout=CALL_TIMEOUT_S)


def connect(uri: str, **options: str):
    """An ADBC connection (DB-API) to ``uri``; ``options``: the driver's database options."""
    timeouts = {
        DatabaseOptions.TIMEOUT_FETCH.value: str(CALL_TIMEOUT_S),
        DatabaseOptions.TIMEOUT_QUERY.value: str(CALL_TIMEOUT_S),
        DatabaseOptions.TIMEOUT_UPDATE.value: str(CALL_TIMEOUT_S),
    }
    return flightsql.connect(uri, db_kwargs={**timeouts, **options}, autocommit=True)


def fetch(uri: str, sql: str, params: tuple | None = None, **options: str) -> pa.Table:
    """``sql``'s result through a new ADBC connection."""
    with connect(uri, **options) as conn, conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetch_arrow_table()


def self_signed(tmp: Path) -> tuple[bytes, bytes]:
    """(certificate, key) in PEM for 127.0.0.1 and localhost, valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    pem_key = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), pem_key
