"""Java programs' jars, fetched from Maven Central once into .cache/ by a POM's dependencies (one
fetch per POM, even with several test processes at once)."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FETCH_TIMEOUT_S = 600


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def maven_jars(pom: Path, name: str, what: str) -> Path:
    """The directory of ``pom``'s runtime jars under .cache/``name``; ``what``: the program they
    make, for messages."""
    cache = REPO / ".cache" / name
    lib = cache / hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    if lib.is_dir():
        return lib
    for tool in ("mvn", "java"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{what} needs {tool!r} on PATH (Java 17 and Maven)")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.is_dir():
            return lib
        part = cache / "partial"
        shutil.rmtree(part, ignore_errors=True)
        argv = ["mvn", "-q", "-B", "-Dstyle.color=never", "-f", str(pom), "dependency:copy-dependencies"]
        argv += [f"-DoutputDirectory={part}", "-DincludeScope=runtime"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"fetching {what} from Maven Central took over {FETCH_TIMEOUT_S} s ({' '.join(argv)})"
            ) from None
        if done.returncode != 0:
            raise RuntimeError(
                f"cannot fetch {what} from Maven Central ({' '.join(argv)}):\n{tail(done.stdout + done.stderr)}"
            )
        part.rename(lib)
    return lib
