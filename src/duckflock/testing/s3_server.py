"""S3-compatible servers as processes of their own on a free loopback port: moto's for the tests
and ``bench lake`` (moto is the test extra's and the benchmarks' dependency; only its command is
run here), and any other server command ``bench lake`` starts (``serving``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(
    argv: Sequence[str], port: int, what: str, env: dict[str, str] | None = None, log: Path | None = None
) -> Iterator[str]:
    """The command ``argv`` (a server listening on ``port`` of 127.0.0.1) while the block runs;
    its endpoint URL. Its output goes to ``log`` (or nowhere). RuntimeError naming ``what`` when it
    has not started within 30 s."""
    with open(log or os.devnull, "wb") as out:
        proc = subprocess.Popen(list(argv), env={**os.environ, **(env or {})}, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{what} did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def moto_process(env: dict[str, str] | None = None, log: Path | None = None) -> Iterator[str]:
    """moto's server, with its settings in ``env``, while the block runs; its endpoint URL. ``log``:
    a file for its output, a line per request (method and path)."""
    port = free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with serving(argv, port, "moto's S3 server", env, log) as endpoint:
        yield endpoint


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
