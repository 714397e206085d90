"""Starting and stopping real `duckflock worker` processes for tests."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path


class Workers:
    """``n`` workers on loopback (or on the given hosts, via a command prefix such as
    ``ip netns exec host1``), each on a port the OS picks."""

    def __init__(
        self,
        data: Path,
        n: int,
        tmp: Path,
        idle_timeout: float = 600.0,
        hosts: list[tuple[str, list[str]]] | None = None,
        extra: list[str] | None = None,
    ):
        self.token = secrets.token_hex(16)
        self.token_file = tmp / "token"
        self.token_file.write_text(self.token)
        self.procs: list[subprocess.Popen] = []
        self.addresses: list[str] = []
        hosts = hosts or [("127.0.0.1", [])] * n
        for i, (host, prefix) in enumerate(hosts[:n]):
            log = open(tmp / f"worker{i}.log", "w")  # noqa: SIM115 - closed with the process
            cmd = [
                *prefix,
                sys.executable,
                "-m",
                "duckflock.cli.main",
                "worker",
                "--listen",
                f"{host}:0",
                "--data",
                str(data),
                "--token-file",
                str(self.token_file),
                "--idle-timeout",
                str(idle_timeout),
                *(extra or []),
            ]
            self.procs.append(
                subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=os.environ.copy())
            )
        for proc in self.procs:
            line = proc.stdout.readline()
            match = re.search(r"on grpc\+(?:tcp|tls)://(\S+):(\d+)", line)
            if not match:
                self.stop()
                raise RuntimeError(f"worker did not start: {line!r}")
            self.addresses.append(f"{match.group(1)}:{match.group(2)}")

    def kill(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(timeout=10)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
