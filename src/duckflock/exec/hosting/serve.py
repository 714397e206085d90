"""An MPI job serving one Python session (``backends.mpi_job``): rank 0 takes requests from the
client over a local socket (multiprocessing.connection, authenticated; ``exec.control.messages``) and
answers them; other ranks serve rank 0.

Results travel as an Arrow IPC file in shared memory (/dev/shm when present): the client maps it,
so a large result is not copied through the socket.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import tempfile
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Client, Connection
from pathlib import Path

import pyarrow as pa

from duckflock.config import Config
from duckflock.errors import DuckflockError
from duckflock.exchange import pickling
from duckflock.exec.control.cancel import Cancel
from duckflock.exec.control.driver import Driver
from duckflock.exec.control.messages import (
    CancelRequest,
    CloseRequest,
    ErrorReply,
    PlanReply,
    PlanRequest,
    Ready,
    SqlReply,
    SqlRequest,
)
from duckflock.exec.hosting.launch import launcher_rank
from duckflock.exec.hosting.ranks import LocalRanks
from duckflock.exec.resources.runtime import Runtime, mpi_runtimes

AUTHKEY_ENV = "DUCKFLOCK_SESSION_KEY"
STARTUP_ERROR = "startup-error-"  # + the process's MPI rank: why it could not start, next to the socket


def shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def write_result_file(table: pa.Table) -> str:
    fd, path = tempfile.mkstemp(prefix="duckflock-result-", suffix=".arrow", dir=shm_dir())
    with os.fdopen(fd, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    return path


def main(runtimes: Callable[[str, Config], list[Runtime]] = mpi_runtimes) -> None:
    """``runtimes``: this process's ranks (an MPI job's; exec/hosting/storage_serve.py: a storage job's)."""
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--address", required=True)
    args = p.parse_args()
    try:
        ranks = LocalRanks(runtimes(args.data, Config.from_env()), fatal_exits=True)
    except DuckflockError as e:  # told to the client, which reports it as the job's failure to start
        cause = Path(args.address).with_name(f"{STARTUP_ERROR}{launcher_rank()}")
        cause.write_text(str(e))
        raise SystemExit(1) from None
    rt = ranks.first
    if rt.rank != 0:
        ranks.serve()
        ranks.close()
        return
    driver = Driver(rt)
    conn = Client(args.address, authkey=bytes.fromhex(os.environ[AUTHKEY_ENV]))
    requests = _Requests(conn)
    try:
        conn.send(Ready(rt.size))
        while True:
            request = requests.next()
            if request is None or isinstance(request, CloseRequest):  # None: the client went away
                break
            try:
                # Progress snapshots go from the driver's progress thread, ahead of the reply.
                reply: SqlReply | PlanReply | ErrorReply = driver.answer(
                    request,
                    write_result_file,
                    lambda progress: conn.send_bytes(pickling.dumps(progress)),
                    requests.cancel,
                )
            except DuckflockError as e:
                reply = ErrorReply(e)
            except Exception as e:  # a bug: report it with its traceback, keep serving
                reply = ErrorReply(DuckflockError(f"internal error: {e}\n{traceback.format_exc()}"))
            try:
                conn.send_bytes(pickling.dumps(reply))
            except OSError:  # the client is gone (killed): no one will map the result's file
                if isinstance(reply, SqlReply):
                    with contextlib.suppress(OSError):
                        os.unlink(reply.rows)
                break
    finally:
        driver.broadcast_stop()
        ranks.close()
        conn.close()


class _Requests:
    """The client's requests, read by a thread of their own so that a ``CancelRequest`` (or the
    client going away) stops the query under way at once, while the main thread runs it. Each
    request gets its cancel token as it is read: a cancel read right behind it is its own."""

    def __init__(self, conn: Connection):
        self._conn = conn
        self._queue: queue.Queue[tuple[object, Cancel]] = queue.Queue()
        self._latest = Cancel()
        self.cancel = self._latest  # the request being answered's
        threading.Thread(target=self._read, name="duckflock-requests", daemon=True).start()

    def next(self) -> SqlRequest | PlanRequest | CloseRequest | None:
        request, self.cancel = self._queue.get()
        return request  # type: ignore[return-value]

    def _read(self) -> None:
        while True:
            try:
                request = self._conn.recv()
            except (EOFError, OSError):
                self._latest.set("the session's caller went away")
                self._queue.put((None, self._latest))
                return
            if isinstance(request, CancelRequest):  # for a query that may have ended already
                self._latest.set(request.reason)
                continue
            self._latest = Cancel()
            self._queue.put((request, self._latest))


if __name__ == "__main__":
    main()
