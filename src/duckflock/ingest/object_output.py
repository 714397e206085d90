"""A repartitioned table written to an object prefix (``load --output s3://bucket/prefix/``).

Each rank writes its partitions' files locally (ingest/shuffle.py), uploads each whole (an object
appears complete or not at all) under a name that holds the load's id, so a load never overwrites
an object the catalog names, and records its size and ETag as for objects registered in place (a
rank refuses one replaced since). The catalog entry, saved last by rank 0, is the commit point:
until then no query sees the objects, and a failed load removes those it uploaded. The table's
entry says it owns the objects under its prefix (``TableInfo.source``), so a later load that
replaces the table removes them, once the new entry is saved.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from duckflock.catalog import TableInfo
from duckflock.errors import CatalogError
from duckflock.ingest import leases
from duckflock.ingest.leases import Lease
from duckflock.storage import objects

OWNED = "written_to"  # key of TableInfo.source: the prefix whose objects the table owns


def prefix_of(output: str) -> str:
    """``output`` as a prefix ending in '/', refused unless it names an object prefix."""
    uri = objects.uri_of(output)
    if uri is None:
        raise CatalogError(
            f"--output {output} is not an object prefix (s3://bucket/prefix/): a table's local "
            "files go into its data directory"
        )
    bucket, _ = objects.split(uri)
    if not bucket:
        raise CatalogError(f"--output {output} names no bucket")
    return uri.rstrip("/") + "/"


def owned_objects(info: TableInfo | None) -> list[str]:
    """The objects a table wrote itself (none for a table registered in place)."""
    if info is None or not info.source.get(OWNED):
        return []
    return info.object_uris()


def remove(uris: Iterable[str]) -> None:
    """Best effort: an object left behind is no part of any table, only of the bill. A prefix
    emptied so is left without pyarrow's marker object."""
    removed = list(uris)
    for uri in removed:
        with contextlib.suppress(objects.ObjectError):
            objects.delete(uri)
    for prefix in objects.prefixes(removed):
        objects.drop_markers_of(prefix)


@dataclass
class ObjectOutput:
    prefix: str  # s3://bucket/prefix/
    load: str  # the load's id, in every object name
    uploaded: list[str] = field(default_factory=list)

    def check_writable(self, lease: Lease) -> None:
        """Fail before reading any input where the prefix cannot be written (no such bucket,
        access denied, no credentials): the load's lease object is put, and stays until the load
        has ended (``release``)."""
        try:
            leases.put_object(lease)
        except objects.ObjectError as e:
            raise CatalogError(f"cannot write the table to {self.prefix}: {e}") from None

    def put(self, local: Path) -> objects.Stamp:
        """Upload a written file and remove it; the object's stamp."""
        uri = f"{self.prefix}{local.stem}-{self.load}{local.suffix}"
        self.uploaded.append(uri)  # before the upload: a failed multipart upload leaves nothing, or all
        objects.upload(local, uri)
        local.unlink()
        return objects.stamp(uri)

    def release(self, lease: Lease) -> None:
        """The load has ended: its lease object goes (and the prefix's marker, if it is empty)."""
        uri = lease.object_uri()
        if uri is not None:
            remove([uri])

    def discard(self) -> None:
        """Remove what this rank uploaded (the load failed before its catalog entry was saved)."""
        remove(self.uploaded)
        self.uploaded.clear()
