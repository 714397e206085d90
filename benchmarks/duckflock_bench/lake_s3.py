"""The object store of ``bench lake``: moto's S3 server as a process of its own, uploads, its own
read throughput, and tables registered in place (the way tests/s3_support.py does for the tests)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from duckflock.config import Config
from duckflock.exec.runtime import Runtime
from duckflock.ingest.load import load_table
from duckflock.storage import objects
from duckflock.testing.s3_server import environment, moto_process
from duckflock.transport.inproc import InProcTransport

KEYS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"}
MAX_OBJECT = 32 << 20  # moto answers a range request by reading its whole object: keep them small


@contextmanager
def moto_s3(log: str | None = None) -> Iterator[str]:
    """moto's server on a free loopback port (its requests logged to ``log``), and this process's
    (and its ranks') environment pointing at it while the block runs; its endpoint URL."""
    with (
        moto_process(log=log) as endpoint,
        environment({**KEYS, "AWS_ENDPOINT_URL": endpoint, "DUCKFLOCK_S3_TIMEOUT_S": "60"}),
    ):
        yield endpoint


def create_bucket(endpoint: str, bucket: str) -> None:
    import boto3  # moto's dependency; pyarrow's filesystem is not allowed to create buckets

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)


def upload_files(files: list[Path], prefix: str) -> tuple[list[str], int, float]:
    """Upload each file to ``prefix``/name: (their URIs, bytes, seconds)."""
    uris, size, t0 = [], 0, time.perf_counter()
    for f in files:
        if f.stat().st_size > MAX_OBJECT:
            raise ValueError(
                f"{f} is {f.stat().st_size >> 20} MB: more than {MAX_OBJECT >> 20} MB per object"
            )
        uri = f"{prefix}/{f.name}"
        objects.upload(f, uri)
        uris.append(uri)
        size += f.stat().st_size
    return uris, size, time.perf_counter() - t0


def get_throughput(uri: str, repeats: int = 3) -> float:
    """moto's MB/s for a whole-object GET of ``uri`` (the best of ``repeats``): the store's ceiling."""
    bucket, key = objects.split(uri)
    best = float("inf")
    size = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        with objects.filesystem().open_input_file(f"{bucket}/{key}") as f:
            size = len(f.read())
        best = min(best, time.perf_counter() - t0)
    return size / best / 1e6


def register(catalog_dir: Path, table: str, files: list[str]) -> None:
    """Register ``files`` (paths or object URIs) in place as ``table`` of ``catalog_dir``: one
    rank in this process, as ``duckflock load`` without --partition-by does."""
    catalog_dir.mkdir(parents=True, exist_ok=True)
    [transport] = InProcTransport.group(1)
    rt = Runtime.create(transport, None, Config(threads=1), ranks_on_node=1)
    try:
        load_table(rt, 1, catalog_dir, table, files)
    finally:
        rt.close()
