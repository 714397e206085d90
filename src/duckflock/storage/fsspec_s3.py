"""The fsspec filesystem DuckDB reads ``s3://`` objects through (storage/objects.py registers it).

Reads are positional (``read_at``): DuckDB seeks and reads a handle in two calls, and a file object
that keeps its own offset for a stream (fsspec's buffered files, obstore's) returned short or
misplaced reads under DuckDB's threads. Each open checks the object against its registered stamp.
"""

from __future__ import annotations

from typing import Any

from fsspec import AbstractFileSystem

from duckflock.storage import objects


class ObjectFile:
    """A read-only object: ``seek``/``tell``/``read`` over pyarrow's positional reads."""

    def __init__(self, raw: Any, uri: str):
        self._raw, self.uri, self.size, self.loc = raw, uri, raw.size(), 0
        self.closed = False

    def seek(self, loc: int, whence: int = 0) -> int:
        self.loc = loc if whence == 0 else self.loc + loc if whence == 1 else self.size + loc
        return self.loc

    def tell(self) -> int:
        return self.loc

    def read(self, length: int = -1) -> bytes:
        end = self.size if length is None or length < 0 else min(self.size, self.loc + length)
        if end <= self.loc:
            return b""
        try:
            data = bytes(self._raw.read_at(end - self.loc, self.loc))
        except Exception as e:
            raise objects.ObjectError(f"reading object {self.uri} failed: {e}") from None
        self.loc += len(data)
        objects.count_fetched(self.uri, len(data))
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True
        self._raw.close()

    def __enter__(self) -> ObjectFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ObjectFileSystem(AbstractFileSystem):
    protocol = ("s3",)
    cachable = False
    root_marker = ""

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        path = path[len(objects.SCHEME) :] if path.startswith(objects.SCHEME) else path
        return path.rstrip("/")

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        import pyarrow.fs as pafs

        key = self._strip_protocol(path)
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
        try:
            raw = objects.filesystem().open_input_file(key)
        except FileNotFoundError:
            raise objects.ObjectError(
                f"object {uri} does not exist (deleted after it was registered?)"
            ) from None
        except Exception as e:
            raise objects.ObjectError(f"cannot read object {uri}: {e}") from None
        objects.check_opened(uri, raw.size(), objects.etag_of(raw.metadata()))
        return ObjectFile(raw, uri)

    def modified(self, path: str) -> Any:
        import datetime as dt

        return dt.datetime.now(dt.timezone.utc)  # noqa: UP017
