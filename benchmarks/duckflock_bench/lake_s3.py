"""The object store of ``bench lake``: its server (lake_store.py) as a process of its own, uploads,
its own read throughput, and tables registered in place (the way tests/s3_support.py does for the tests)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from duckflock.config import Config
from duckflock.exec.resources.runtime import Runtime
from duckflock.ingest.load import load_table
from duckflock.storage import objects
from duckflock.testing.s3_server import environment
from duckflock.transport.inproc import InProcTransport
from duckflock_bench import lake_store
from duckflock_bench.measure import median

KEYS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_REGION": "us-east-1",
    # The AWS SDK streams uploads with a trailing checksum (no Content-Length) by default;
    # gofakes3 refuses those (411), moto takes either.
    "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
}
MAX_OBJECT = 32 << 20  # moto answers a range request by reading its whole object: keep them small


@contextmanager
def s3(store: str, work: Path) -> Iterator[lake_store.Server]:
    """The store's server (lake_store.py) on a free loopback port, and this process's (and its
    ranks') environment pointing at it while the block runs."""
    with (
        lake_store.server(store, work) as server,
        environment({**KEYS, "AWS_ENDPOINT_URL": server.endpoint, "DUCKFLOCK_S3_TIMEOUT_S": "60"}),
    ):
        yield server


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


def throughput(uri: str, repeats: int = 5) -> dict[str, float]:
    """The store's own speed through pyarrow's S3 client (as the adapter reads it), medians of
    ``repeats``: whole-object GETs (MB/s), 4 MB range GETs (MB/s) and 64 KB range GETs (ms each:
    a request's latency, as for a Parquet footer or a small column chunk)."""
    bucket, key = objects.split(uri)
    fs = objects.filesystem()
    whole, big, small = [], [], []
    size = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        with fs.open_input_file(f"{bucket}/{key}") as f:
            size = len(f.read())
        whole.append(time.perf_counter() - t0)
    with fs.open_input_file(f"{bucket}/{key}") as f:
        for i in range(repeats):
            at = (i * 7919 * 4096) % max(1, size - (4 << 20))
            t0 = time.perf_counter()
            f.read_at(4 << 20, at)
            big.append(time.perf_counter() - t0)
        for i in range(4 * repeats):
            t0 = time.perf_counter()
            f.read_at(64 << 10, (i * 104729 * 64) % max(1, size - (64 << 10)))
            small.append(time.perf_counter() - t0)
    return {
        "object_bytes": size,
        "whole_get_mb_s": size / median(whole) / 1e6,
        "range_4mb_get_mb_s": min(size, 4 << 20) / median(big) / 1e6,
        "range_64kb_get_ms": median(small) * 1e3,
    }


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
