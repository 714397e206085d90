"""Apache Iceberg's REST catalog server (the code of the apache/iceberg-rest-fixture image) on a free
loopback port: its jars fetched from Maven Central once into .cache/ (tests/iceberg_rest/pom.xml),
run by the machine's Java with a SQLite catalog and a warehouse in a local directory."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from maven_support import maven_jars, tail

POM = Path(__file__).resolve().parent / "iceberg_rest" / "pom.xml"
START_TIMEOUT_S = 120  # a JVM starting on two busy cores


def server_jars() -> Path:
    """The directory of the server's jars, fetched by Maven on first use."""
    return maven_jars(POM, "iceberg-rest", "Apache Iceberg's REST catalog server")


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
                        f"Iceberg's REST catalog server did not start:\n{tail(log_path.read_text())}"
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
