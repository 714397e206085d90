"""``duckflock serve``: an Arrow Flight SQL endpoint (flightsql/server.py) over ranks on this machine,
as threads of this process or as an MPI job, or over running Flight workers."""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import socket
import threading
from typing import TYPE_CHECKING

from duckflock.errors import DuckflockError

if TYPE_CHECKING:  # the parser is built by every rank of a job: it imports nothing more
    from duckflock.flightsql.auth import Credentials
    from duckflock.session import Session

TOKEN_ENV = "DUCKFLOCK_SERVE_TOKEN"
PASSWORD_ENV = "DUCKFLOCK_SERVE_PASSWORD"


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("serve", help="serve queries over Arrow Flight SQL (ADBC, JDBC, BI tools)")
    s.add_argument("--data", default=None, help="data directory (ranks here)")
    s.add_argument("--ranks", type=int, default=2, help="number of ranks (default 2)")
    s.add_argument(
        "--transport",
        choices=["threads", "mpi"],
        default="threads",
        help="the ranks: threads of this process (default) or an MPI job",
    )
    s.add_argument("--workers", default=None, help="HOST:PORT,HOST:PORT,...: duckflock workers as the ranks")
    s.add_argument("--workers-token-file", default=None, help="the workers' shared token (with --workers)")
    s.add_argument("--workers-tls-root", default=None, help="PEM certificate to trust for TLS workers")
    s.add_argument("--listen", default="127.0.0.1:31337", help="HOST:PORT (default 127.0.0.1:31337)")
    s.add_argument(
        "--token-file", default=None, help=f"file holding the bearer token clients give (or ${TOKEN_ENV})"
    )
    s.add_argument("--user", default=None, help=f"a username clients log in with (password: ${PASSWORD_ENV})")
    s.add_argument("--tls-cert", default=None, help="PEM certificate: serve TLS (grpc+tls://)")
    s.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    s.add_argument(
        "--idle-timeout",
        type=float,
        default=600.0,
        help="seconds a result waits to be fetched, and a prepared statement unused, before it is "
        "dropped (default 600)",
    )


def run_serve(args: argparse.Namespace) -> int:
    import importlib.util

    import pyarrow as pa

    if importlib.util.find_spec("google.protobuf") is None:
        raise DuckflockError("duckflock serve needs protobuf: pip install 'duckflock[serve]'")

    from duckflock.cli.commands import read_pem
    from duckflock.cli.listen import check_listen
    from duckflock.cli.output import stdout_console
    from duckflock.flightsql.server import FlightSqlServer

    if (args.tls_cert is None) != (args.tls_key is None):
        raise DuckflockError("--tls-cert and --tls-key go together")
    credentials = _credentials(args)
    host, _ = check_listen(args.listen)
    if credentials is None and not _loopback(host):
        raise DuckflockError(
            f"--listen {args.listen} is reachable from other machines: give --token-file (or ${TOKEN_ENV}) "
            f"or --user with ${PASSWORD_ENV}, so that not everyone who reaches it can query"
        )
    cert, key = read_pem(args.tls_cert), read_pem(args.tls_key)
    tls = (cert, key) if cert is not None and key is not None else None
    scheme = "grpc+tls" if tls else "grpc"
    session, ranks = _session(args)
    with session:
        try:
            server = FlightSqlServer(
                f"{'grpc+tls' if tls else 'grpc+tcp'}://{args.listen}",
                session,
                credentials,
                tls,
                args.idle_timeout,
            )
        except pa.ArrowException as e:  # e.g. the port taken since check_listen tried it
            raise DuckflockError(f"cannot listen on {args.listen}: {e}") from None
        stdout_console().print(
            f"duckflock serve: Arrow Flight SQL on {scheme}://{host}:{server.port}, {ranks}",
            highlight=False,
            soft_wrap=True,
        )
        _wait_for_a_stop_signal()
        server.stop()  # a query under way is interrupted, not waited for
    return 0


def _wait_for_a_stop_signal() -> None:
    """Until Ctrl-C or SIGTERM. The server answers on threads of its own meanwhile; this thread
    waits in Python, so the signal is seen at once (Flight's own serve() leaves the stop to gRPC,
    which waits for a running query to end)."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _session(args: argparse.Namespace) -> tuple[Session, str]:
    """The session to serve (its ranks here, or Flight workers), and what its ranks are, in words."""
    import duckflock
    from duckflock.catalog import Catalog
    from duckflock.cli.commands import read_pem, read_token
    from duckflock.flightsql.server import open_session

    if args.workers:
        if args.data:
            raise DuckflockError(
                "--data does not go with --workers: each worker reads its own data directory"
            )
        if not args.workers_token_file:
            raise DuckflockError("--workers needs --workers-token-file (the workers' shared token)")
        workers = [w.strip() for w in args.workers.split(",") if w.strip()]
        token = read_token(args.workers_token_file)
        root = read_pem(args.workers_tls_root)
        session = duckflock.connect(workers=workers, token=token, tls_root_cert=root)
        return session, f"{len(workers)} Flight workers"
    if not args.data:
        raise DuckflockError("give --data DIR (ranks here) or --workers HOST:PORT,... (Flight workers)")
    Catalog.load(args.data)  # fail fast, before starting any rank
    return open_session(
        args.data, args.ranks, args.transport
    ), f"{args.ranks} ranks ({args.transport}) over {args.data}"


def _credentials(args: argparse.Namespace) -> Credentials | None:
    """The Credentials the command line and environment give; None: every caller is taken."""
    from duckflock.cli.commands import read_token
    from duckflock.flightsql.auth import Credentials

    token = read_token(args.token_file) if args.token_file else os.environ.get(TOKEN_ENV) or None
    if token is not None and len(token) < 16:
        raise DuckflockError(f"the token in ${TOKEN_ENV} is too short (use at least 16 characters)")
    password = os.environ.get(PASSWORD_ENV) or None
    if (args.user is None) != (password is None):
        raise DuckflockError(f"--user and ${PASSWORD_ENV} go together")
    if token is None and args.user is None:
        return None
    return Credentials(token, args.user, password)


def _loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (127.0.0.0/8, ::1)."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), None)
    except socket.gaierror:
        return False
    return all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)
