"""The S3-compatible server ``bench lake`` reads from: gofakes3 (MIT, Go; its filesystem backend
serves objects as files, a range request by a seek) built on first use from the Go module proxy
into the repository's ``.cache/``, or moto's server (the tests' store: it answers each range
request by reading its whole object, ~5 ms, and is the ceiling of any engine reading through it).

Measured with pyarrow's S3 client (lake_s3.throughput: a 24 MB object, medians of 7, two rounds
each on the shared 2-core machine under load): gofakes3 whole GET 460-510 MB/s, 4 MB range GETs
440-490 MB/s, a 64 KB range GET 0.5-0.6 ms; moto 130-150 MB/s, 55-130 MB/s, 14-35 ms. Each run of
``bench lake`` measures its store again and reports it beside the queries.

gofakes3 needs uploads with a Content-Length (lake_s3.KEYS turns off the SDK's streamed checksums).
s3s-fs (Rust, Apache-2.0) was not tried; gofakes3 builds in about 1.5 min here."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from duckflock.testing.s3_server import free_port, moto_process, serving
from duckflock_bench.jobs import err

STORES = ("gofakes3", "moto")
GOFAKES3 = "github.com/johannesboyne/gofakes3/cmd/gofakes3"
GOFAKES3_VERSION = "v1.2.0"
CACHE = Path(__file__).resolve().parents[2] / ".cache"


def gofakes3_binary(cache: Path = CACHE) -> Path | str:
    """The gofakes3 command, built with ``go install`` into ``cache`` the first time; a string
    saying why it cannot be had (no Go toolchain, the build failed)."""
    target = cache / f"gofakes3-{GOFAKES3_VERSION}"
    binary = target / "gofakes3"
    if binary.is_file():
        return binary
    go = shutil.which("go")
    if go is None:
        return "no Go toolchain (go) on PATH to build gofakes3"
    err.print(f"building gofakes3 {GOFAKES3_VERSION} into {target} (once)", highlight=False)
    target.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            [go, "install", f"{GOFAKES3}@{GOFAKES3_VERSION}"],
            env={**os.environ, "GOBIN": str(target), "CGO_ENABLED": "0"},
            capture_output=True,
            text=True,
            timeout=900,
        )
    except subprocess.TimeoutExpired:
        return "building gofakes3 took more than 15 minutes"
    if done.returncode != 0 or not binary.is_file():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"building gofakes3 failed: {last}"
    return binary


def choose(asked: str | None) -> str:
    """The store to use: the one asked for, else gofakes3 when it can be built, else moto (saying why)."""
    if asked == "moto":
        return "moto"
    found = gofakes3_binary()
    if isinstance(found, Path):
        return "gofakes3"
    if asked == "gofakes3":
        raise RuntimeError(f"--store gofakes3: {found}")
    err.print(f"[yellow]{found}: reading from moto's server instead (slower: ~5 ms a range request)[/]")
    return "moto"


def new_lines(log: Path, offset: int) -> tuple[list[str], int]:
    """The whole lines a server wrote to ``log`` after ``offset``, and the offset after them (a line
    still being written is read next time)."""
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read()
    done = text.rfind(b"\n") + 1
    return text[:done].decode(errors="replace").splitlines(), offset + done


class RequestLog:
    """Requests the server answered, counted from its log (gofakes3 logs each one; moto: none)."""

    KINDS = {"GET OBJECT": "get", "HEAD OBJECT": "head", "LIST BUCKET": "list", "bucketName:": "list"}

    def __init__(self, path: Path | None):
        self.path, self._at, self._seen = path, 0, dict.fromkeys(("get", "head", "list"), 0)

    def counts(self) -> dict[str, int] | None:
        """Requests so far, by kind (get, head, list); None where the server logs none."""
        if self.path is None:
            return None
        lines, self._at = new_lines(self.path, self._at)
        for line in lines:
            kind = next((k for m, k in self.KINDS.items() if m in line), None)
            if kind:
                self._seen[kind] += 1
        return dict(self._seen)


@dataclass
class Server:
    endpoint: str
    requests: RequestLog
    moto_log: Path | None = None  # moto's output, a line per request (lake_exchange counts them)


@contextmanager
def server(store: str, work: Path) -> Iterator[Server]:
    """The store's server on a free loopback port while the block runs (gofakes3 keeps its objects
    in a directory under ``work``, removed after, and logs each request there)."""
    if store == "moto":
        work.mkdir(parents=True, exist_ok=True)
        log = work / "moto.log"
        with moto_process(log=log) as endpoint:
            yield Server(endpoint, RequestLog(None), log)
        return
    binary = gofakes3_binary()
    assert isinstance(binary, Path), binary
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work, prefix="gofakes3-") as root:
        port, log = free_port(), Path(root) / "requests.log"
        argv = [str(binary), "-backend", "fs", "-fs.path", f"{root}/data", "-fs.create"]
        with serving([*argv, "-host", f"127.0.0.1:{port}"], port, "gofakes3", log=log) as endpoint:
            yield Server(endpoint, RequestLog(log))


def describe(store: str) -> dict[str, str]:
    if store == "moto":
        from importlib.metadata import version

        return {"version": version("moto"), "license": "Apache-2.0"}
    return {"version": GOFAKES3_VERSION, "license": "MIT", "backend": "fs (objects as files)"}
