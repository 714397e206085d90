"""Starting and stopping real ``duckflock worker`` processes (Arrow Flight), on loopback or on other
"hosts" through a command prefix; used by ``bench flight``, ``bench netem`` and the tests."""

from __future__ import annotations

import os
import re
import secrets
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

from duckflock.errors import DuckflockError


class FlightWorkers:
    """``duckflock worker`` processes, one per (address, command prefix) host, each on a port the OS
    picks; a context manager. The prefix runs a worker elsewhere, e.g. ``ip netns exec <namespace>``.
    ``idle_timeout`` (None: the worker's default) and ``extra`` go to every worker's command line."""

    def __init__(
        self,
        data: Path,
        hosts: list[tuple[str, list[str]]],
        workdir: Path,
        timeout: float = 60,
        idle_timeout: float | None = None,
        extra: list[str] | None = None,
    ):
        workdir.mkdir(parents=True, exist_ok=True)
        self.token = secrets.token_hex(16)
        self.token_file = workdir / "token"
        self.token_file.write_text(self.token)
        self.token_file.chmod(0o600)
        self.procs: list[subprocess.Popen] = []
        self.addresses: list[str] = []
        options = [
            *(["--idle-timeout", str(idle_timeout)] if idle_timeout is not None else []),
            *(extra or []),
        ]
        try:
            for i, (host, prefix) in enumerate(hosts):
                with open(workdir / f"worker{i}.log", "w") as log:
                    cmd = [
                        *prefix, sys.executable, "-m", "duckflock.cli.main", "worker",
                        "--listen", f"{host}:0", "--data", str(data), "--token-file", str(self.token_file),
                        *options,
                    ]  # fmt: skip
                    self.procs.append(
                        subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log)
                    )
            deadline = time.monotonic() + timeout
            for i, proc in enumerate(self.procs):
                self.addresses.append(listening_address(proc, deadline, workdir / f"worker{i}.log"))
        except BaseException:
            self.stop()
            raise

    def kill(self, i: int) -> None:
        """SIGKILL worker ``i`` (a crash, not a shutdown) and wait for it to end."""
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(timeout=10)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
            if p.stdout is not None:
                p.stdout.close()

    def __enter__(self) -> FlightWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def listening_address(
    proc: subprocess.Popen, deadline: float, log: Path, what: str = "a duckflock worker"
) -> str:
    """HOST:PORT from the start-up line of a worker (or of ``duckflock serve``): it picks a free port
    itself. Raw reads, not readline: a line wrapped by its console must not leave text stuck in a
    buffer."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    seen = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline and sel.select(timeout=max(0.0, deadline - time.monotonic())):
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            seen += chunk
            m = re.search(rb"on grpc(?:\+tcp|\+tls)?://(\S+):(\d+)", seen.replace(b"\n", b" "))
            if m:
                return f"{m.group(1).decode()}:{m.group(2).decode()}"
    tail = log.read_text()[-2000:] if log.exists() else ""
    raise DuckflockError(f"{what} did not start: {seen.decode(errors='replace').strip()!r} {tail}")
