"""The user-facing session and result objects."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import pyarrow as pa

from duckflock.exec.driver import QueryOutcome
from duckflock.exec.progress import ProgressCallback
from duckflock.exec.stage import StageStats
from duckflock.plan.explain import explain_plan


@dataclass
class Result:
    """A finished query: the rows as Arrow plus how the query ran."""

    outcome: QueryOutcome

    def arrow(self) -> pa.Table:
        return self.outcome.table

    def df(self):
        return self.outcome.table.to_pandas()

    def pl(self):
        import polars as pl

        return pl.from_arrow(self.outcome.table)

    def fetchall(self) -> list[tuple]:
        cols = [c.to_pylist() for c in self.outcome.table.columns]
        return list(zip(*cols, strict=True))

    @property
    def stats(self) -> list[StageStats]:
        return self.outcome.stats

    @property
    def seconds(self) -> float:
        return self.outcome.seconds

    def show(self, max_rows: int = 20) -> None:
        from duckflock.cli.output import print_table

        print_table(self.outcome.table, max_rows=max_rows)

    def __repr__(self) -> str:
        t = self.outcome.table
        return f"<duckflock.Result {t.num_rows} rows x {t.num_columns} columns in {self.seconds:.3f} s>"


class Session:
    """Runs queries on a set of warm ranks. Backed by a driver (MPI) or a remote session."""

    def __init__(self, backend):
        self._backend = backend

    def sql(self, query: str, profile: bool = False, progress: ProgressCallback | None = None) -> Result:
        """Run a query. ``progress`` is called with ``duckflock.Progress`` snapshots (stages done and
        running, rows and bytes moved) while it runs, possibly from another thread: keep it quick."""
        return Result(self._backend.run(query, profile=profile, progress=progress))

    @property
    def ranks(self) -> int:
        return self._backend.ranks

    def explain(self, query: str, analyze: bool = False) -> str:
        """The stage plan; with ``analyze`` the query runs and each stage shows what it really did."""
        if not analyze:
            return explain_plan(self._backend.plan(query))
        outcome = self._backend.run(query, profile=True)
        total = f"\ntotal {outcome.seconds:.3f} s, {outcome.table.num_rows:,} result rows"
        return explain_plan(outcome.plan, outcome.stats) + total

    def close(self) -> None:
        close = getattr(self._backend, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _MpiJobBackend:
    """A background ``mpiexec`` job of warm ranks; this process is its client."""

    def __init__(self, data: str, ranks: int, config_env: dict[str, str], start_timeout: float):
        import os
        import secrets
        import shutil
        import socket
        import subprocess
        import tempfile
        import time
        from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

        from duckflock.catalog import Catalog
        from duckflock.errors import DuckflockError
        from duckflock.exec.launch import mpiexec_argv
        from duckflock.exec.serve import AUTHKEY_ENV

        Catalog.load(data)  # a bad data directory fails here, at once, not in every rank
        key = secrets.token_bytes(32)
        self._dir = tempfile.mkdtemp(prefix="duckflock-session-")
        address = os.path.join(self._dir, "control.sock")
        # A plain socket with a timeout (multiprocessing's Listener has none), authenticated with
        # multiprocessing's documented challenge functions, as Listener.accept would.
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(address)
        self._listener.listen(1)
        self._listener.settimeout(0.2)
        env = {**os.environ, **config_env, AUTHKEY_ENV: key.hex()}
        argv = mpiexec_argv(
            ranks, ["-m", "duckflock.exec.serve", "--data", str(data), "--address", address], self._dir
        )
        # mpiexec's own output (MPICH's banner when a rank dies) goes to a log: how a rank died is
        # reported as one message by _call.
        self._log = os.path.join(self._dir, "mpiexec.out")
        with open(self._log, "wb") as log:
            self._proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log)
        # Wait for rank 0, but give up as soon as mpiexec ends, and after start_timeout at most.
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                sock, _ = self._listener.accept()
                sock.setblocking(True)
                self._conn = Connection(sock.detach())
                deliver_challenge(self._conn, key)
                answer_challenge(self._conn, key)
                break
            except OSError:
                code = self._proc.poll()
                if code is None and time.monotonic() < deadline:
                    continue
                if code is None:
                    self._proc.kill()
                self._listener.close()
                shutil.rmtree(self._dir, ignore_errors=True)
                why = (
                    f"mpiexec exited with code {code}"
                    if code is not None
                    else f"not within {start_timeout:.0f} s"
                )
                raise DuckflockError(f"the {ranks} ranks did not start: {why}") from None
        _, self.ranks = self._conn.recv()

    def _call(self, *request, progress: ProgressCallback | None = None):
        from duckflock.errors import DuckflockError

        try:
            self._conn.send(request)
            reply = self._conn.recv()
            while reply[0] == "progress":  # snapshots come ahead of the reply while the query runs
                if progress is not None:
                    progress(reply[1])
                reply = self._conn.recv()
        except (EOFError, OSError):
            raise DuckflockError(self._ended()) from None
        if reply[0] == "error":
            raise reply[1]
        return reply[1:]

    def _ended(self) -> str:
        """Why the job ended under a call: the rank the OS killed, or mpiexec's exit code."""
        import subprocess
        from pathlib import Path

        from duckflock.exec.launch import job_outcome

        try:
            code = self._proc.wait(timeout=30)  # MPICH ends the other ranks
        except subprocess.TimeoutExpired:
            self._proc.kill()
            code = self._proc.wait()
        banner = Path(self._log).read_bytes() if os.path.exists(self._log) else b""
        why = job_outcome(self._dir, code, banner) or f"exit code {code}"
        return f"the MPI job ended unexpectedly: {why}; open a new session to go on"

    def run(self, query: str, profile: bool = False, progress: ProgressCallback | None = None):
        path, outcome = self._call("sql", query, profile, progress is not None, progress=progress)
        try:
            with pa.memory_map(path) as source:
                outcome.table = pa.ipc.open_file(source).read_all()
        finally:
            os.unlink(path)  # the mapping stays valid; the file name is gone
        return outcome

    def plan(self, query: str):
        return self._call("plan", query)[0]

    def close(self) -> None:
        import shutil

        if self._proc.poll() is None:
            with contextlib.suppress(OSError):
                self._conn.send(("close",))
            try:
                self._proc.wait(timeout=30)
            except Exception:
                self._proc.kill()
        self._conn.close()
        self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)


class _FlightBackend:
    """A session on running workers over Arrow Flight. The first worker plans each query and returns
    its result; the workers exchange data among themselves, never through this process."""

    def __init__(self, workers: list[str], token: str, tls_root: bytes | None, config: dict[str, object]):
        import json
        import secrets

        import pyarrow.flight as flight

        from duckflock.errors import TransportError
        from duckflock.transport.flight import CallAuth, client_for

        scheme = "grpc+tls" if tls_root else "grpc+tcp"
        self.locations = [w if "://" in w else f"{scheme}://{w}" for w in workers]
        self.ranks = len(self.locations)
        self.sid = secrets.token_hex(8)
        self._json = json
        self._flight = flight
        self._auth = CallAuth(token).options
        self._clients = [client_for(loc, tls_root) for loc in self.locations]
        body = {"session": self.sid, "peers": self.locations, "config": config}
        try:
            for phase in ("prepare", "start"):
                for rank, client in enumerate(self._clients):
                    self._action(client, phase, {**body, "rank": rank}, rank)
        except TransportError:
            self.close()
            raise

    def _action(self, client, kind: str, body: dict, rank: int = 0, progress: ProgressCallback | None = None):
        """One action's reply: its last result (sql with progress streams snapshots before it)."""
        import pickle

        from duckflock.errors import TransportError

        payload = b""
        try:
            action = self._flight.Action(kind, self._json.dumps(body).encode())
            for result in client.do_action(action, options=self._auth):
                payload = result.body.to_pybytes()
                if progress is not None and (reply := pickle.loads(payload))[0] == "progress":
                    progress(reply[1])
        except self._flight.FlightUnauthenticatedError:
            raise TransportError(f"worker {rank} at {self.locations[rank]} refused the token") from None
        except self._flight.FlightError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TransportError(f"worker {rank} at {self.locations[rank]}: {first}") from None
        if kind in ("sql", "plan"):
            reply = pickle.loads(payload)
            if reply[0] == "error":
                raise reply[1]
            return reply[1:]
        return payload

    def run(self, query: str, profile: bool = False, progress: ProgressCallback | None = None):
        body = {"session": self.sid, "query": query, "profile": profile, "progress": progress is not None}
        outcome, ticket = self._action(self._clients[0], "sql", body, progress=progress)
        reader = self._clients[0].do_get(
            self._flight.Ticket(self._json.dumps([self.sid, ticket]).encode()), options=self._auth
        )
        outcome.table = reader.read_all()
        return outcome

    def plan(self, query: str):
        return self._action(self._clients[0], "plan", {"session": self.sid, "query": query})[0]

    def close(self) -> None:
        from duckflock.errors import TransportError

        for rank, client in enumerate(self._clients):
            with contextlib.suppress(TransportError):
                self._action(client, "close", {"session": self.sid}, rank)
            client.close()


def connect(
    data: str | None = None,
    ranks: int = 2,
    config: dict[str, object] | None = None,
    start_timeout: float = 60.0,
    transport: str = "mpi",
    workers: list[str] | None = None,
    token: str | None = None,
    tls_root_cert: bytes | None = None,
) -> Session:
    """A session of warm ranks.

    With ``workers=["host:port", ...]`` and ``token``: a session on running ``duckflock worker``
    processes over Arrow Flight (TLS when ``tls_root_cert`` is given). Otherwise ``ranks`` ranks over
    the data directory ``data`` on this machine: ``transport="mpi"`` as an MPI job (``mpiexec``),
    ``"threads"`` as threads of this process. ``config`` overrides Config fields (e.g.
    ``{"broadcast_threshold_bytes": 0}``). Use as a context manager, or call ``close()``.
    """
    from duckflock.errors import DuckflockError

    if workers is not None:
        if not token:
            raise DuckflockError("workers need the shared token (token=... or --token-file)")
        return Session(_FlightBackend(list(workers), token, tls_root_cert, dict(config or {})))
    if data is None:
        raise DuckflockError("connect() needs a data directory, or workers=[...]")
    if transport == "threads":
        from duckflock.config import Config
        from duckflock.exec.local_cluster import LocalCluster

        return Session(LocalCluster(str(data), ranks, Config.from_env(**(config or {}))))
    if transport != "mpi":
        raise DuckflockError(f"unknown transport {transport!r} (use 'mpi' or 'threads')")
    env = {f"DUCKFLOCK_{k.upper()}": str(v) for k, v in (config or {}).items()}
    return Session(_MpiJobBackend(str(data), ranks, env, start_timeout))
