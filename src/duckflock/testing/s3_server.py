"""moto's S3 server as a process of its own on a free loopback port, for the tests and ``bench
lake`` (moto is the test extra's and the benchmarks' dependency; only its command is run here)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO


@contextmanager
def moto_process(env: dict[str, str] | None = None, log: str | None = None) -> Iterator[str]:
    """The server, with its settings in ``env``, while the block runs; its endpoint URL. ``log``: a
    file for its output, a line per request (method and path)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    out: IO[str] | int = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
        if not isinstance(out, int):
            out.close()


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """These environment variables (read by duckflock, boto3 and rank processes started inside)
    while the block runs; then as they were."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
