"""The fsspec filesystem DuckDB reads ``s3://`` objects through (storage/objects.py registers it).

Reads are positional (``read_at``): DuckDB seeks and reads a handle in two calls, and a file object
that keeps its own offset for a stream (fsspec's buffered files, obstore's) returned short or
misplaced reads under DuckDB's threads. The first open of an object in a query checks it against
its registered stamp (a HEAD request); DuckDB's later opens of it and its questions of size and
existence are answered from the stamp, so a query makes about one HEAD request per object instead
of one per open.
"""

from __future__ import annotations

import threading
from typing import Any

from fsspec import AbstractFileSystem

from duckflock.storage import objects

# DuckDB reads a Parquet object smaller than about this whole several times a query (its footer,
# then each column chunk's prefetch covers all of it): such an object, once checked, is fetched
# once and read from memory until a query checks it again, saving the repeated GETs of small
# tables' objects.
WHOLE_BELOW = 1 << 20


class WholeObject:
    """A small object, fetched whole by its first read (pyarrow's handle ``raw``)."""

    def __init__(self, raw: Any, uri: str):
        self._raw, self.uri, self._data = raw, uri, b""
        self._lock = threading.Lock()
        self._fetched = False

    def size(self) -> int:
        return int(self._raw.size())

    def read_at(self, length: int, at: int) -> bytes:
        with self._lock:
            if not self._fetched:
                self._data = bytes(self._raw.read_at(self.size(), 0))
                self._fetched = True
                objects.count_fetched(self.uri, len(self._data))
        return self._data[at : at + length]

    def close(self) -> None:
        self._raw.close()


class ObjectFile:
    """A read-only object: ``seek``/``tell``/``read`` over pyarrow's positional reads.

    The offset is each thread's own: DuckDB's threads share a handle and call ``seek`` and ``read``
    separately, and pyarrow lets go of the GIL while reading, so with one offset a thread's read
    could start where another's seek (or the end of another's read) left it: misplaced data, or
    none past the end (``only 0 bytes returned``)."""

    def __init__(self, raw: Any, uri: str, owned: bool = True):
        self._raw, self.uri, self.size, self._owned = raw, uri, raw.size(), owned
        self._counted = not isinstance(raw, WholeObject)  # which counts its one fetch itself
        self._at = threading.local()
        self.closed = False

    @property
    def loc(self) -> int:
        return getattr(self._at, "loc", 0)

    @loc.setter
    def loc(self, value: int) -> None:
        self._at.loc = value

    def seek(self, loc: int, whence: int = 0) -> int:
        self.loc = loc if whence == 0 else self.loc + loc if whence == 1 else self.size + loc
        return self.loc

    def tell(self) -> int:
        return self.loc

    def read(self, length: int = -1) -> bytes:
        start = self.loc
        end = self.size if length is None or length < 0 else min(self.size, start + length)
        if end <= start:
            return b""
        try:
            data = bytes(self._raw.read_at(end - start, start))
        except Exception as e:
            raise objects.ObjectError(f"reading object {self.uri} failed: {e}") from None
        self.loc = start + len(data)
        if self._counted:
            objects.count_fetched(self.uri, len(data))
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True
        if self._owned:  # a shared handle stays open for the next open of its object
            self._raw.close()

    def __enter__(self) -> ObjectFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ObjectFileSystem(AbstractFileSystem):
    protocol = ("s3",)
    cachable = False
    root_marker = ""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._checked: dict[str, Any] = {}  # pyarrow's handle of each object last checked, by URI

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        path = path[len(objects.SCHEME) :] if path.startswith(objects.SCHEME) else path
        return path.rstrip("/")

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        import pyarrow.fs as pafs

        key = self._strip_protocol(path)
        known = objects.expected(objects.SCHEME + key)
        if known is not None:  # DuckDB asks each object's size a few times a query: no HEAD each
            return {"name": key, "size": known.size, "type": "file"}
        try:
            found = objects.filesystem().get_file_info(key)
        except Exception as e:
            raise objects.ObjectError(f"cannot read {objects.SCHEME}{key}: {e}") from None
        if found.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"object {objects.SCHEME}{key} does not exist")
        kind = "directory" if found.type == pafs.FileType.Directory else "file"
        return {"name": key, "size": found.size or 0, "type": kind}

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        prefix = objects.SCHEME + self._strip_protocol(path) + "/"
        entries = [
            {"name": u[len(objects.SCHEME) :], "size": n, "type": "file"} for u, n in objects.listing(prefix)
        ]
        return entries if detail else [e["name"] for e in entries]

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> ObjectFile:
        if "r" not in mode:
            raise objects.ObjectError(f"{path}: DuckDB writes no objects here (results are uploaded whole)")
        key = self._strip_protocol(path)
        uri = objects.SCHEME + key
        with self._lock:
            raw = self._checked.get(uri) if objects.opening(uri) else None
        if raw is not None:  # checked in this query: its handle again, no HEAD request
            return ObjectFile(raw, uri, owned=False)
        try:
            raw = objects.filesystem().open_input_file(key)
        except FileNotFoundError:
            raise objects.ObjectError(
                f"object {uri} does not exist (deleted after it was registered?)"
            ) from None
        except Exception as e:
            raise objects.ObjectError(f"cannot read object {uri}: {e}") from None
        if objects.check_opened(uri, raw.size(), objects.etag_of(raw.metadata())):
            if raw.size() < WHOLE_BELOW:
                raw = WholeObject(raw, uri)
            with self._lock:  # reads are positional: DuckDB's opens of it can share the handle
                self._checked[uri] = raw
            return ObjectFile(raw, uri, owned=False)
        return ObjectFile(raw, uri)

    def modified(self, path: str) -> Any:
        import datetime as dt

        return dt.datetime.now(dt.timezone.utc)  # noqa: UP017
