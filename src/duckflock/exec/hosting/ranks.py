"""This process's ranks: the first runs in the caller's thread (as the driver on rank 0, else by
serving it); the others serve in threads of their own until the driver says stop."""

from __future__ import annotations

import os
import sys
import threading
import traceback

from duckflock.exec.control.driver import serve
from duckflock.exec.resources.runtime import Runtime


class LocalRanks:
    def __init__(self, runtimes: list[Runtime], fatal_exits: bool):
        """``fatal_exits``: a serving thread that fails outside a query (a bug) ends the process, as
        would a rank process, so that the job ends instead of waiting for the rank (not for ranks in
        a caller's own process: its thread ends)."""
        self.runtimes = runtimes
        self._fatal_exits = fatal_exits
        self._threads = [
            threading.Thread(target=self._serve, args=(rt,), name=f"duckflock-rank-{rt.rank}", daemon=True)
            for rt in runtimes[1:]
        ]
        for t in self._threads:
            t.start()

    @property
    def first(self) -> Runtime:
        return self.runtimes[0]

    def serve(self) -> None:
        """Serve the driver on the first rank too (a process without rank 0), until it says stop."""
        self._serve(self.first)

    def _serve(self, rt: Runtime) -> None:
        try:
            serve(rt)
        except BaseException:
            # Unwinding the main thread would close DuckDB and MPI under the other ranks' threads.
            if not self._fatal_exits or len(self.runtimes) == 1:
                raise
            print(f"duckflock rank {rt.rank}: internal error\n{traceback.format_exc()}", file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)

    def close(self) -> None:
        """After the driver's stop: wait for the serving threads, then release every rank."""
        for t in self._threads:
            t.join(timeout=30)
        for rt in self.runtimes:
            rt.close()
