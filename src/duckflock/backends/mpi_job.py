"""A background ``mpiexec`` job of warm ranks; this process is its client.

Rank 0 of the job (``exec.hosting.serve``) connects back to a Unix socket of ours and answers requests
(``exec.control.messages``); a result's rows come as an Arrow IPC file in shared memory, mapped here.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from duckflock.backends.base import expect_reply
from duckflock.catalog import Catalog
from duckflock.errors import DuckflockError, QueryCancelled
from duckflock.exec.control.cancel import Cancel
from duckflock.exec.control.messages import (
    CancelRequest,
    CloseRequest,
    ErrorReply,
    PlanReply,
    PlanRequest,
    ProgressReply,
    Ready,
    SqlReply,
    SqlRequest,
)
from duckflock.exec.control.progress import Follow
from duckflock.exec.hosting.launch import job_outcome, mpiexec_job, owned_temp_dir, per_process
from duckflock.exec.hosting.serve import AUTHKEY_ENV, STARTUP_ERROR
from duckflock.exec.reports import ProgressCallback, QueryOutcome
from duckflock.plan.stages import StagePlan

if TYPE_CHECKING:
    from duckflock.flightsql.parts import PartServing

_POLL_S = 0.2  # how soon a Ctrl-C is seen while waiting for the ranks
# How long a cancelled query's reply may take before the job is stopped instead: the ranks stop
# within a second; one that does not (frozen, or a bug) must not hold the caller.
_CANCEL_GRACE_S = 10.0
_LOG = "mpiexec.out"  # in the job's directory: the launcher's own output


@dataclass(frozen=True)
class Job:
    """A started job: its launcher process and directory, with its rank 0 connected and ready."""

    proc: subprocess.Popen[bytes]
    conn: Connection
    directory: str
    ranks: int  # as rank 0 reports them
    per_process: int  # ranks in each of its processes


def start(
    data: str, ranks: int, configured: int, config_env: dict[str, str], start_timeout: float
) -> MpiJobBackend:
    """A session on a new MPI job of ``ranks`` ranks over the data directory ``data``, ``configured``
    ranks in each process (0: all in one), once its rank 0 is ready (within ``start_timeout``)."""
    return MpiJobBackend(MpiJobBackend.launch(data, ranks, configured, config_env, start_timeout))


class MpiJobBackend:
    kind = "MPI job"  # for messages
    serve_module = "duckflock.exec.hosting.serve"  # what the job's processes run
    # A process group of the job's own: a terminal's Ctrl-C then reaches only this process, whose
    # session cancels the query (a storage job; an MPI job's ranks have always taken it with us).
    _own_group = False

    def __init__(self, job: Job):
        """A session on a started job (``start`` starts one)."""
        self._proc, self._conn, self._dir = job.proc, job.conn, job.directory
        self._per_process = job.per_process
        self._log = os.path.join(job.directory, _LOG)
        self.ranks = job.ranks
        self._interrupted = False

    @classmethod
    def launch(
        cls, data: str, ranks: int, configured: int, config_env: dict[str, str], start_timeout: float
    ) -> Job:
        """Start the job's processes and wait for its rank 0 to connect back and be ready."""
        Catalog.load(data)  # a bad data directory fails here, at once, not in every rank
        placed = per_process(ranks, configured)  # as does a placement that cannot be
        key = secrets.token_bytes(32)
        directory = owned_temp_dir("session")
        address = os.path.join(directory, "control.sock")
        # A plain socket with a timeout (multiprocessing's Listener has none), authenticated with
        # multiprocessing's documented challenge functions, as Listener.accept would.
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(1)
        listener.settimeout(0.2)
        python_args = ["-m", cls.serve_module, "--data", str(data), "--address", address]
        argv, job_env = cls._command(ranks, placed, python_args, directory)
        env = {**os.environ, **config_env, **job_env, AUTHKEY_ENV: key.hex()}
        # mpiexec's own output (MPICH's banner when a rank dies) goes to a log: how a rank died is
        # reported as one message by _call.
        with open(os.path.join(directory, _LOG), "wb") as log:
            proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=log, start_new_session=cls._own_group
            )
        # Wait for rank 0, but give up as soon as mpiexec ends, and after start_timeout at most.
        deadline = time.monotonic() + start_timeout
        with listener:
            while True:
                try:
                    sock, _ = listener.accept()
                    sock.setblocking(True)
                    conn = Connection(sock.detach())
                    deliver_challenge(conn, key)
                    answer_challenge(conn, key)
                    break
                except OSError:
                    code = proc.poll()
                    if code is None and time.monotonic() < deadline:
                        continue
                    if code is None:
                        proc.kill()
                    causes = sorted(Path(directory).glob(f"{STARTUP_ERROR}*"))
                    why = (
                        causes[0].read_text()
                        if causes
                        else f"{Path(argv[0]).name} exited with code {code}"
                        if code is not None
                        else f"not within {start_timeout:.0f} s"
                    )
                    shutil.rmtree(directory, ignore_errors=True)
                    raise DuckflockError(f"the {ranks} ranks did not start: {why}") from None
        try:
            ready = expect_reply(Ready, conn.recv(), "rank 0")
        except BaseException:
            proc.kill()
            proc.wait()
            conn.close()
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return Job(proc, conn, directory, ready.ranks, placed)

    @classmethod
    def _command(
        cls, ranks: int, per_process: int, python_args: list[str], directory: str
    ) -> tuple[list[str], dict[str, str]]:
        """The job's launcher command and its environment."""
        return mpiexec_job(ranks, per_process, python_args, directory)

    def _call(
        self,
        request: SqlRequest | PlanRequest,
        progress: ProgressCallback | None = None,
        cancel: Cancel | None = None,
    ) -> SqlReply | PlanReply:
        if self._interrupted:
            raise DuckflockError(
                "the session's job was stopped when a query was interrupted (by Ctrl-C or an "
                "exception raised meanwhile); open a new session to go on"
            )
        follow = Follow(progress)
        cancel = cancel or Cancel()
        try:
            self._conn.send(request)
            with cancel.hooked(lambda reason: self._conn.send(CancelRequest(reason=reason))):
                reply = self._recv(cancel)
                while isinstance(reply, ProgressReply):  # snapshots come ahead of the reply
                    follow(reply.progress)
                    reply = self._recv(cancel)
        except (EOFError, ConnectionError):  # not any OSError: a caller's TimeoutError is one
            raise DuckflockError(self._ended()) from None
        except BaseException:
            # A Ctrl-C, or any exception raised in this thread meanwhile (a signal handler's): the
            # ranks would go on with the query, and its reply would answer the next request (each
            # later query got the one before's rows). The job ends with the interrupted query.
            self._interrupted = True
            self._stop_job()
            raise
        if isinstance(reply, ErrorReply):
            raise reply.error
        follow.raise_error()
        return reply

    def _recv(self, cancel: Cancel) -> SqlReply | PlanReply | ProgressReply | ErrorReply:
        """The next message, waited for in short polls: a Ctrl-C the kernel hands to another thread
        of this process (DuckDB's, Arrow's) does not end a blocking read, so the main thread would
        never see its KeyboardInterrupt. After a cancel, the job is stopped if rank 0 does not
        answer within the grace period."""
        cancelled_at: float | None = None
        while not self._conn.poll(_POLL_S):
            if cancel.reason is None:
                continue
            cancelled_at = cancelled_at or time.monotonic()
            if time.monotonic() - cancelled_at > _CANCEL_GRACE_S:
                self._interrupted = True
                self._stop_job()
                raise QueryCancelled(
                    f"{cancel.reason}; the ranks did not stop within {_CANCEL_GRACE_S:.0f} s, so "
                    "the session's job was stopped: open a new session to go on"
                )
        return pickle.loads(self._conn.recv_bytes())  # pickled by exchange.pickling

    def _ended(self) -> str:
        """Why the job ended under a call: the rank the OS killed, or mpiexec's exit code."""
        try:
            code = self._proc.wait(timeout=30)  # MPICH ends the other ranks
        except subprocess.TimeoutExpired:
            self._proc.kill()
            code = self._proc.wait()
        banner = Path(self._log).read_bytes() if os.path.exists(self._log) else b""
        why = job_outcome(self._dir, code, banner, self._per_process) or self._exit_reason(code)
        return f"the {self.kind} ended unexpectedly: {why}; open a new session to go on"

    def _exit_reason(self, code: int) -> str:
        return f"exit code {code}"

    def run(
        self,
        query: str,
        profile: bool = False,
        progress: ProgressCallback | None = None,
        output: str | None = None,
        cancel: Cancel | None = None,
        serve_parts: PartServing | None = None,
    ) -> QueryOutcome:
        if output is not None:
            output = _absolute(output)  # the ranks may run in another directory
        request = SqlRequest(
            query, profile, progress=progress is not None, output=output, serve_parts=serve_parts
        )
        reply = expect_reply(SqlReply, self._call(request, progress, cancel), "rank 0")
        try:
            with pa.memory_map(reply.rows) as source:
                reply.outcome.table = pa.ipc.open_file(source).read_all()
        finally:
            os.unlink(reply.rows)  # the mapping stays valid; the file name is gone
        return reply.outcome

    def plan(self, query: str) -> StagePlan:
        return expect_reply(PlanReply, self._call(PlanRequest(query)), "rank 0").plan

    def _stop_job(self) -> None:
        """mpiexec ends the ranks it started on SIGTERM; SIGKILL if it does not within 5 s."""
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def close(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(OSError):
                self._conn.send(CloseRequest())
            try:
                self._proc.wait(timeout=30)
            except Exception:
                self._proc.kill()
        self._conn.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _absolute(path: str) -> str:
    trailing = os.sep if path.endswith(("/", os.sep)) else ""
    return os.path.abspath(path) + trailing
