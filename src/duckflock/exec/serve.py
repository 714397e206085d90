"""An MPI job serving one Python session: rank 0 takes queries from the client over a local socket
(multiprocessing.connection, authenticated) and answers with results; other ranks serve rank 0.

Results travel as an Arrow IPC file in shared memory (/dev/shm when present): the client maps it,
so a large result is not copied through the socket.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import traceback
from multiprocessing.connection import Client

import pyarrow as pa

from duckflock.catalog import Catalog
from duckflock.config import Config
from duckflock.errors import DuckflockError
from duckflock.exec.driver import Driver, serve
from duckflock.exec.runtime import mpi_runtime

AUTHKEY_ENV = "DUCKFLOCK_SESSION_KEY"


def shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def write_result_file(table: pa.Table) -> str:
    fd, path = tempfile.mkstemp(prefix="duckflock-result-", suffix=".arrow", dir=shm_dir())
    with os.fdopen(fd, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    return path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--address", required=True)
    args = p.parse_args()
    rt = mpi_runtime(Catalog.load(args.data), Config.from_env())
    if rt.rank != 0:
        serve(rt)
        rt.close()
        return
    driver = Driver(rt)
    conn = Client(args.address, authkey=bytes.fromhex(os.environ[AUTHKEY_ENV]))
    try:
        conn.send(("ready", rt.size))
        while True:
            try:
                request = conn.recv()
            except EOFError:  # the client went away: shut the job down
                break
            if request[0] == "close":
                break
            try:
                if request[0] == "sql":
                    _, query, profile, follow = request
                    progress = (lambda p: conn.send(("progress", p))) if follow else None
                    outcome = driver.run(query, profile=profile, progress=progress)
                    path = write_result_file(outcome.table)
                    outcome.table = None  # type: ignore[assignment]
                    conn.send(("ok", path, outcome))
                elif request[0] == "plan":
                    conn.send(("ok", driver.plan(request[1])))
            except DuckflockError as e:
                conn.send(("error", e))
            except Exception as e:  # a bug: report it with its traceback, keep serving
                conn.send(("error", DuckflockError(f"internal error: {e}\n{traceback.format_exc()}")))
    finally:
        driver.broadcast_stop()
        rt.close()
        conn.close()


if __name__ == "__main__":
    main()
