"""``duckflock vacuum``: remove what loads killed on the way left behind, which no catalog entry
names: objects under the output prefixes of the data directory's tables and of its loads' leases,
their lease objects and records, and staging directories in the data directory.

Never what a load still running may be writing (ingest/leases.py): a prefix with a live lease is
left alone, and so is an object or staging directory younger than ``older_than_s``; a load whose
lease has ended (its process is gone) left only garbage. Objects the catalog names, lease objects of
live loads and anything outside those prefixes are never touched.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from duckflock.catalog import Catalog
from duckflock.catalog.catalog import CATALOG_FILE
from duckflock.ingest import leases
from duckflock.ingest.load import STAGING_PREFIX
from duckflock.ingest.object_output import OWNED, remove
from duckflock.storage import objects

# What a load names the objects it writes directly under its prefix (ingest/object_output.py):
# <file>-<load tag>.<ext>, and its lease object. Nothing else under a prefix is looked at.
_LOADS_OWN = re.compile(r"[^/]+-[0-9a-f]{12}\.[a-z]+|" + re.escape(leases.OBJECT_PREFIX) + r"[0-9a-f]{12}")


@dataclass
class Garbage:
    objects: list[str] = field(default_factory=list)  # URIs
    paths: list[Path] = field(default_factory=list)  # staging directories and lease records
    skipped: list[str] = field(default_factory=list)  # prefixes a live load writes to, and why
    jobs: list[str] = field(default_factory=list)  # storage-exchange jobs: <exchange location>/<job>

    def lines(self) -> list[str]:
        return [*self.objects, *map(str, self.paths), *self.jobs]


def find(root: Path, older_than_s: float, exchanges: Sequence[str] = ()) -> Garbage:
    """What ``vacuum`` would remove from the data directory ``root`` and its output prefixes, and
    from the storage-exchange locations ``exchanges``."""
    from duckflock.transport.storage import stale_jobs

    now = time.time()
    catalog = Catalog.load(root) if (root / CATALOG_FILE).is_file() else Catalog(root, {}, {})
    named = {f for t in catalog.tables.values() for p in t.partitions for f in p.files}
    named |= {o[0] for t in catalog.tables.values() for o in t.objects}
    prefixes = {str(t.source[OWNED]) for t in catalog.tables.values() if t.source.get(OWNED)}
    found = Garbage()
    live: set[str] = set()  # tags of loads that may be running
    busy: set[str] = set()  # their prefixes
    for path, lease in leases.records(root):
        if lease is not None and lease.alive(older_than_s, now):
            live.add(lease.tag)
            if lease.prefix:
                busy.add(lease.prefix)
                found.skipped.append(f"{lease.prefix} (load {lease.tag} of {lease.table!r} is running)")
        elif now - path.stat().st_mtime >= older_than_s:
            found.paths.append(path)
        if lease is not None and lease.prefix:
            prefixes.add(lease.prefix)
    for prefix in sorted(prefixes - busy):
        found.objects.extend(_in_prefix(prefix, named, older_than_s, now, found))
    for staging in sorted(root.glob(f"*/{STAGING_PREFIX}*")):
        tag = staging.name[len(STAGING_PREFIX) :][:12]
        if staging.is_dir() and tag not in live and now - staging.stat().st_mtime >= older_than_s:
            found.paths.append(staging)
    for location in exchanges:
        found.jobs.extend(f"{location.rstrip('/')}/{job}" for job in stale_jobs(location, older_than_s, now))
    return found


def _in_prefix(prefix: str, named: set[str], older_than_s: float, now: float, found: Garbage) -> list[str]:
    """The objects under ``prefix`` no table names, none if a live load writes there."""
    listed = objects.listing_times(prefix)
    marks = [u for u, _ in listed if u[len(prefix) :].startswith(leases.OBJECT_PREFIX)]
    for uri in marks:
        lease = leases.Lease.from_json(objects.get_bytes(uri))
        if lease is None or lease.alive(older_than_s, now):
            found.skipped.append(f"{prefix} (a load is running: {uri})")
            return []
    return [
        u
        for u, mtime in listed
        if _LOADS_OWN.fullmatch(u[len(prefix) :]) and u not in named and now - mtime >= older_than_s
    ]


def vacuum(
    data: str | os.PathLike[str],
    older_than: float = 3600.0,
    dry_run: bool = False,
    exchanges: Sequence[str] = (),
) -> Garbage:
    """Remove from the data directory ``data`` and its output prefixes what killed loads left
    behind (see the module's doc), and from the storage-exchange locations ``exchanges`` the jobs
    of killed launchers (no object renewed for ``older_than``), unless ``dry_run``; what that was.
    ``older_than`` (seconds): nothing younger is removed, and a load on another host counts as
    running until its lease is that old."""
    from duckflock.transport.storage import remove_job

    found = find(Path(data).resolve(), older_than, exchanges)
    if not dry_run:
        remove(found.objects)
        for path in found.paths:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        for job in found.jobs:
            location, _, name = job.rpartition("/")
            remove_job(location, name)
    return found
