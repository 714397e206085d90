"""Apache Iceberg's REST catalog server (the code of the apache/iceberg-rest-fixture image) on a free
loopback port: its jars fetched from Maven Central once into .cache/ (tests/iceberg_rest/pom.xml),
run by the machine's Java with a SQLite catalog and a warehouse in a local directory."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
POM = REPO / "tests" / "iceberg_rest" / "pom.xml"
FETCH_TIMEOUT_S = 600
START_TIMEOUT_S = 120  # a JVM starting on two busy cores


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def server_jars() -> Path:
    """The directory of the server's jars, fetched by Maven on first use (one fetch per POM, even
    with several test processes at once)."""
    cache = REPO / ".cache" / "iceberg-rest"
    lib = cache / hashlib.sha256(POM.read_bytes()).hexdigest()[:16]
    if lib.is_dir():
        return lib
    for tool in ("mvn", "java"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"the Iceberg REST catalog tests need {tool!r} on PATH (Java 17 and Maven)")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.is_dir():
            return lib
        part = cache / "partial"
        shutil.rmtree(part, ignore_errors=True)
        argv = ["mvn", "-q", "-B", "-Dstyle.color=never", "-f", str(POM), "dependency:copy-dependencies"]
        argv += [f"-DoutputDirectory={part}", "-DincludeScope=runtime"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"fetching Apache Iceberg's REST catalog server from Maven Central took over "
                f"{FETCH_TIMEOUT_S} s ({' '.join(argv)})"
            ) from None
        if done.returncode != 0:
            raise RuntimeError(
                f"cannot fetch Apache Iceberg's REST catalog server from Maven Central "
                f"({' '.join(argv)}):\n{_tail(done.stdout + done.stderr)}"
            )
        part.rename(lib)
    return lib


@contextmanager
def rest_catalog(base: Path) -> Iterator[str]:
    """The server, its catalog and warehouse in directory ``base``, while the block runs; its URI."""
    lib = server_jars()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    warehouse = base / "warehouse"
    warehouse.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "CATALOG_WAREHOUSE": str(warehouse),
        "CATALOG_URI": f"jdbc:sqlite:{base / 'catalog.db'}",
        "CATALOG_REST_PORT": str(port),  # the server's property rest.port
    }
    argv = ["java", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", f"{lib}/*"]
    argv.append("org.apache.iceberg.rest.RESTCatalogServer")
    uri = f"http://127.0.0.1:{port}"
    log_path = base / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(f"{uri}/v1/config", timeout=5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Iceberg's REST catalog server did not start:\n{_tail(log_path.read_text())}"
                    ) from None
                time.sleep(0.2)
        yield uri
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
