"""A moto S3 server on a free loopback port, and the environment that points duckflock at it."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import boto3

from duckflock.storage import objects
from duckflock.testing.s3_server import environment, moto_process  # noqa: F401  (tests import it here)

KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 in a thread of this process; its endpoint URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextmanager
def s3_env(endpoint: str, **extra: str) -> Iterator[None]:
    """duckflock (and boto3) talk to ``endpoint`` while the block runs, with short timeouts."""
    values = {**KEYS, "AWS_ENDPOINT_URL": endpoint, "DUCKFLOCK_S3_TIMEOUT_S": "2", **extra}
    with environment(values):
        yield


@contextmanager
def bucket(name: str):  # type: ignore[no-untyped-def]
    """A moto server in this process with one bucket; duckflock's environment points at it while
    the block runs. Yields a boto3 client."""
    with moto_server() as endpoint, s3_env(endpoint):
        c = client(endpoint)
        c.create_bucket(Bucket=name)
        yield c


def client(endpoint: str):  # type: ignore[no-untyped-def]
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEYS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=KEYS["AWS_SECRET_ACCESS_KEY"],
        region_name=KEYS["AWS_REGION"],
    )


def upload_tree(s3, local: Path, bucket: str, prefix: str, pattern: str = "**/*.parquet") -> list[str]:  # type: ignore[no-untyped-def]
    """Upload the files under ``local`` matching ``pattern``; their URIs."""
    uris = []
    for f in sorted(local.glob(pattern)):
        key = f"{prefix}/{f.relative_to(local).as_posix()}"
        s3.upload_file(str(f), bucket, key)
        uris.append(f"s3://{bucket}/{key}")
    return uris


@contextmanager
def silent_server() -> Iterator[str]:
    """An endpoint that accepts connections and never answers: a store that stopped responding."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for c in held:
            c.close()
        sock.close()


def opened() -> int:
    return objects.opened()
