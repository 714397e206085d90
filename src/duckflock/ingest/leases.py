"""A load's lease: what it may be writing while it runs, so that ``duckflock vacuum`` can tell the
objects and staging directories of a load killed on the way (SIGKILL, a lost machine) from those of
a load still running.

Rank 0 of a repartitioning load takes one before any rank writes and gives it up when the load has
ended (saved, or failed and cleaned up): a record in the data directory
(``.duckflock-loads/<load id>.json``) and, with ``--output s3://...``, the same record as an object
in the output prefix (``<prefix>.load-<id>``), which a vacuum of another data directory writing to
that prefix sees too. A lease is live while its process runs (same host: the pid with its start
time, so a reused pid is not taken for it); one taken on another host is live until it is older
than the vacuum's ``older_than``, since its process cannot be asked.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from duckflock.processes import pid_alive
from duckflock.storage import objects

RECORDS = ".duckflock-loads"  # under the data directory
OBJECT_PREFIX = ".load-"  # <output prefix>.load-<id>: the lease object (no table's object is dotted)


@dataclass(frozen=True)
class Lease:
    load: str  # the load's id (its objects' names hold its first 12 characters)
    table: str
    prefix: str | None  # s3://bucket/prefix/ it writes objects under, or None (local files)
    host: str
    pid: int
    pid_start: str  # the process's start (Linux: clock ticks after boot), '' where unknown
    started: float  # seconds since the epoch

    @classmethod
    def mine(cls, load: str, table: str, prefix: str | None) -> Lease:
        pid = os.getpid()
        return cls(load, table, prefix, socket.gethostname(), pid, _start_of(pid), time.time())

    @property
    def tag(self) -> str:
        """What names the load's objects and staging directory carry."""
        return self.load[:12]

    def object_uri(self) -> str | None:
        return f"{self.prefix}{OBJECT_PREFIX}{self.tag}" if self.prefix else None

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Lease | None:
        """None for what is not a lease (a partly written or foreign file)."""
        try:
            return cls(**json.loads(data))
        except (ValueError, TypeError):
            return None

    def alive(self, older_than_s: float, now: float | None = None) -> bool:
        """Whether the load may still be writing (see the module's doc)."""
        if self.host == socket.gethostname():
            return _start_of(self.pid) == self.pid_start and pid_alive(self.pid)
        return (now or time.time()) - self.started < older_than_s


def take(root: Path, lease: Lease) -> None:
    """Record the lease in the data directory (the lease object is the output's: ObjectOutput)."""
    d = root / RECORDS
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{lease.load}.tmp"
    tmp.write_bytes(lease.to_json())
    tmp.replace(d / f"{lease.load}.json")


def release(root: Path, lease: Lease) -> None:
    (root / RECORDS / f"{lease.load}.json").unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        (root / RECORDS).rmdir()  # the last one out


def records(root: Path) -> list[tuple[Path, Lease | None]]:
    """The leases recorded in the data directory, with their files."""
    d = root / RECORDS
    found = sorted(d.glob("*.json")) if d.is_dir() else []
    return [(f, Lease.from_json(f.read_bytes())) for f in found]


def _start_of(pid: int) -> str:
    """The process's start time ('' where unknown; 'ended' for a zombie: killed, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return ""
    return "ended" if fields[0] in ("Z", "X") else fields[19]


def put_object(lease: Lease) -> None:
    uri = lease.object_uri()
    if uri is not None:
        objects.put_bytes(uri, lease.to_json())
