"""Objects in S3-compatible buckets: listing, stamps, reading them from DuckDB, writing results.

The one place duckflock talks to object storage; catalog/, ingest/, exec/ and lake tables call these:

* ``is_uri(path)``, ``uri_of(path)``: whether a catalog file or ``--output`` names an object
  (``s3://bucket/key``); ``uri_of`` also undoes what ``pathlib.Path`` makes of one (``s3:/b/k``).
* ``expand(patterns) -> [(uri, size)]``: objects matching ``s3://...`` names or globs (``*``, ``?``,
  ``[...]`` within a path segment, ``**`` across segments), by listing the bucket, in key order.
  ``stamp(uri)``: one object's, by a HEAD request.
* ``register(con, stamps=...)``: makes ``read_parquet('s3://...')`` work in that DuckDB through
  ``DuckDBPyConnection.register_filesystem`` (DuckDB's Parquet reader then does projection and
  row-group pruning with range reads), unless DuckDB's own httpfs is loaded. ``expect(stamps)``: an
  object opened later whose ETag or size differs is refused, naming it (replaced since it was
  registered). ``opened()``: how many objects this process opened (pruning is measured by it).
  ``fetched(uris)``: bytes and reads so far of each of those objects (exec/stages/scan_stats.py's deltas).
* ``prefixes(uris)``: the ``allowed_directories`` that let a confined DuckDB read those objects only.
* ``upload(local, uri)``, ``put_bytes(uri, data)``, ``listing(prefix)``, ``delete(uri)``: results.

How it reaches S3: pyarrow's ``S3FileSystem`` (the AWS SDK; pyarrow is a core dependency) behind a
small fsspec adapter whose files read by position (``read_at``), so DuckDB's threads never share a
file offset; fsspec is the ``[s3]`` extra. Chosen against obstore and s3fs, reading Parquet
objects through DuckDB from moto's server: s3fs was several times slower (with or without its
read-ahead), while pyarrow and obstore tie where DuckDB reads (the server is the bottleneck);
pyarrow's SDK also reads ``AWS_PROFILE`` and shared credentials files, obstore's does not. fsspec's
own ``ArrowFSWrapper`` and obstore's ``FsspecStore`` returned short or interleaved reads to DuckDB
(corrupt pages).

Configuration, as the AWS tools read it: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` with ``~/.aws/credentials`` and ``~/.aws/config`` (the SDK's
chain), ``AWS_REGION`` or ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL`` (``http://host:port`` for an
S3-compatible store; path-style addressing), and ``DUCKFLOCK_S3_ANONYMOUS=1`` for public buckets.
``DUCKFLOCK_S3_TIMEOUT_S`` (10) bounds connecting and each read; ``DUCKFLOCK_S3_RETRIES`` (3) is how
many times a request is tried, with the SDK's backoff between.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from duckflock.errors import DuckflockError

if TYPE_CHECKING:
    import duckdb
    import pyarrow.fs as pafs

SCHEME = "s3://"
# Bytes handed to an object's output stream at once: an upload's writes, and the messages a rank of
# the storage exchange buffers before it writes them as one object (transport/storage.py).
WRITE_BYTES = 8 << 20
_GLOB = re.compile(r"[*?\[]")


class ObjectError(DuckflockError):
    """An object cannot be listed, read or written; the message names it."""


@dataclass(frozen=True)
class Stamp:
    """What an object was when it was registered: a later one with another ETag or size differs."""

    uri: str
    size: int
    etag: str


def is_uri(path: object) -> bool:
    return isinstance(path, str) and path.startswith(SCHEME)


def uri_of(path: str | os.PathLike[str]) -> str | None:
    """The object URI ``path`` names, or None for a local path. ``pathlib.Path`` collapses the
    ``//`` of ``s3://b/k`` to ``s3:/b/k``; code that joins result paths with ``/`` gets that back."""
    text = os.fspath(path)
    if text.startswith(SCHEME):
        return text
    if text.startswith("s3:/"):
        return SCHEME + text[len("s3:/") :]
    return None


def split(uri: str) -> tuple[str, str]:
    """(bucket, key) of ``s3://bucket/key``."""
    bucket, _, key = uri[len(SCHEME) :].partition("/")
    return bucket, key


# ---- settings and the pyarrow filesystem -----------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    endpoint: str | None
    region: str | None
    anonymous: bool
    timeout_s: float
    retries: int

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ
        return cls(
            endpoint=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            anonymous=env.get("DUCKFLOCK_S3_ANONYMOUS", "").lower() in ("1", "true", "yes"),
            timeout_s=float(env.get("DUCKFLOCK_S3_TIMEOUT_S", "10")),
            retries=max(1, int(env.get("DUCKFLOCK_S3_RETRIES", "3"))),
        )


def filesystem(delayed_open: bool = False) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem for the environment's settings (one per process and settings).
    ``delayed_open``: an output stream starts no upload until it is closed, and then writes an
    object smaller than a part with one PUT, not a multi-part upload's three requests (an error
    such as a missing bucket is then reported by the close)."""
    return _filesystem(Settings.from_env(), _credential_env(), delayed_open)


def _credential_env() -> tuple[str | None, ...]:
    # Part of the cache key: a process that changes its keys gets a filesystem with the new ones.
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")
    return tuple(os.environ.get(n) for n in names)


@functools.lru_cache(maxsize=8)
def _filesystem(
    settings: Settings, _credentials: tuple[str | None, ...], delayed_open: bool = False
) -> pafs.S3FileSystem:
    import pyarrow.fs as pafs

    kw: dict[str, Any] = {
        "region": settings.region or "us-east-1",
        "anonymous": settings.anonymous,
        "connect_timeout": settings.timeout_s,
        "request_timeout": settings.timeout_s,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=settings.retries),
        "allow_delayed_open": delayed_open,
    }
    if settings.endpoint:
        scheme, _, host = settings.endpoint.rpartition("://")
        kw.update(endpoint_override=host.rstrip("/"), scheme=scheme or "https")
    return pafs.S3FileSystem(**kw)


def _failed(what: str, e: Exception) -> ObjectError:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return ObjectError(f"{what}: {text}{_no_credentials()}")


# Where the AWS SDK finds credentials, short of an instance's role (which only a request can tell).
_CREDENTIAL_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


def _no_credentials() -> str:
    """A hint for a failure with no credentials configured (the SDK then fails with an error that
    does not say so, e.g. INTERNAL_FAILURE); '' where some are, or the bucket is read anonymously."""
    env = os.environ
    if Settings.from_env().anonymous or any(env.get(n) for n in _CREDENTIAL_ENV):
        return ""
    files = (
        env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials",
        env.get("AWS_CONFIG_FILE") or "~/.aws/config",
    )
    if any(os.path.exists(os.path.expanduser(f)) for f in files):
        return ""
    return (
        " (no AWS credentials are configured: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or "
        "AWS_PROFILE, or DUCKFLOCK_S3_ANONYMOUS=1 for a public bucket)"
    )


# ---- listing and stamps ------------------------------------------------------------------------------


def expand(patterns: Iterable[str]) -> list[tuple[str, int]]:
    """(URI, size) of the objects the names and globs give, each name's matches in key order (a
    name given twice is read twice, as DuckDB's readers do). Raises ObjectError naming what is
    missing. Globs: ``*``, ``?`` and ``[...]`` within a path segment, ``**`` across segments."""
    out: list[tuple[str, int]] = []
    for pattern in patterns:
        if not _GLOB.search(pattern):
            out.append((pattern, stamp(pattern).size))
            continue
        regex = _glob_regex(pattern)
        matches = [(u, n) for u, n in listing(_glob_base(pattern)) if regex.fullmatch(u)]
        if not matches:
            raise ObjectError(f"no object matches {pattern}")
        out.extend(matches)
    return out


def _glob_base(pattern: str) -> str:
    """The prefix up to the last '/' before the first glob character."""
    first = _GLOB.search(pattern)
    head = pattern[: first.start()] if first else pattern
    return head[: head.rfind("/") + 1]


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out = []
    for part in re.split(r"(\*\*/?|\*|\?|\[[^\]]*\])", pattern):
        if part.startswith("**"):
            out.append(".*")
        elif part == "*":
            out.append("[^/]*")
        elif part == "?":
            out.append("[^/]")
        elif part.startswith("[") and part.endswith("]"):
            out.append("[^" + part[2:-1] + "]" if part[1:2] == "!" else part)
        else:
            out.append(re.escape(part))
    return re.compile("".join(out))


def listing(prefix: str) -> list[tuple[str, int]]:
    """(URI, size) of every object under ``prefix`` (``s3://bucket/dir/``), in key order."""
    return [(SCHEME + i.path, i.size) for i in _infos(prefix)]


def listing_times(prefix: str) -> list[tuple[str, float]]:
    """(URI, last modified in seconds since the epoch) of every object under ``prefix``."""
    return [(SCHEME + i.path, i.mtime.timestamp() if i.mtime else 0.0) for i in _infos(prefix)]


def _infos(prefix: str) -> list[pafs.FileInfo]:
    import pyarrow.fs as pafs

    bucket, key = split(prefix)
    if not bucket:
        raise ObjectError(f"{prefix} names no bucket")
    try:
        selector = pafs.FileSelector(f"{bucket}/{key}".rstrip("/"), recursive=True, allow_not_found=True)
        infos = filesystem().get_file_info(selector)
    except Exception as e:
        raise _failed(f"cannot list {prefix}", e) from None
    return sorted((i for i in infos if i.type == pafs.FileType.File), key=lambda i: i.path)


def stamp(uri: str) -> Stamp:
    """The object's size and ETag (a HEAD request); ObjectError naming it when it is not there or
    cannot be read."""
    if not is_uri(uri):
        raise ObjectError(f"{uri} is not an object URI ({SCHEME}bucket/key)")
    bucket, key = split(uri)
    if not bucket or not key or key.endswith("/"):
        raise ObjectError(f"{uri} names no object; give its objects, e.g. {uri.rstrip('/')}/*.parquet")
    try:
        with filesystem().open_input_file(f"{bucket}/{key}") as f:
            meta = f.metadata()
            return Stamp(uri, f.size(), etag_of(meta))
    except FileNotFoundError:
        raise ObjectError(f"object {uri} does not exist") from None
    except Exception as e:
        raise _failed(f"cannot read object {uri}", e) from None


def etag_of(meta: Mapping[Any, Any] | None) -> str:
    """The ETag of pyarrow's metadata of an opened object ('' where the store gives none)."""
    found = {(k.decode() if isinstance(k, bytes) else k): v for k, v in dict(meta or {}).items()}
    value = found.get("ETag", b"")
    return value.decode() if isinstance(value, bytes) else str(value)


def prefixes(uris: Iterable[str]) -> list[str]:
    """The directories holding these objects, for DuckDB's ``allowed_directories``."""
    return sorted({u[: u.rfind("/") + 1] for u in uris if is_uri(u)})


# ---- reading from DuckDB ------------------------------------------------------------------------------

# DuckDB's Parquet reader coalesces the ranges it prefetches when the gap between them is under
# this; a request to a store costs about as much as a few hundred KB more of its body. Left to
# DuckDB (its cost model), a filter column is read apart from the columns beside it, and the ranks
# made far more range requests than single-process DuckDB over the same objects; with this gap
# they make about as many, for a few percent more bytes (columns between the ones read).
PREFETCH_GAP = 1 << 20

_expected: dict[str, Stamp] = {}
_checked: set[str] = set()  # expected objects whose ETag was checked since they were last expected
_opened: list[int] = [0]
_fetched: dict[str, tuple[int, int]] = {}  # (bytes, reads) by this process's DuckDBs, by object URI
_lock = threading.Lock()


def expect(stamps: Iterable[Stamp]) -> None:
    """Objects opened from now on must still be these (same ETag and size). Each is checked (a
    HEAD request) the first time it is opened after ``begin_query`` or after it was expected with
    another stamp; DuckDB opens an object and asks its size several times in one query, and those
    are answered from its stamp."""
    with _lock:
        for s in stamps:
            if _expected.get(s.uri) != s:
                _checked.discard(s.uri)
            _expected[s.uri] = s


def begin_query() -> None:
    """A query starts in this process: each object it opens is checked again, once, whatever
    stages read it. Per stage, TPC-H Q2 at SF 10 on 2 ranks made 761 HEAD requests for 1249 GETs
    (each stage checked every object it opened)."""
    with _lock:
        _checked.clear()


def expected(uri: str) -> Stamp | None:
    """The stamp the object is expected to have, if it was registered."""
    with _lock:
        return _expected.get(uri)


def opening(uri: str) -> bool:
    """Called by the adapter when DuckDB opens an object: whether it was checked since it was last
    expected (it needs no HEAD request); if not, check it (``check_opened``)."""
    with _lock:
        if uri not in _checked:
            return False
        _opened[0] += 1
        return True


def opened() -> int:
    """Objects this process opened for reading through DuckDB so far."""
    return _opened[0]


def fetched(uris: Iterable[str]) -> dict[str, tuple[int, int]]:
    """(bytes, reads) so far (every range DuckDB asked for) of each of these objects. Kept per object,
    not per connection: the adapter is the process's, and its ranks (as threads) read other
    partitions' objects, so a stage's delta over its own objects is its own (not for a replicated
    table two ranks of one process read at once)."""
    with _lock:
        return {u: _fetched.get(u, (0, 0)) for u in uris}


def count_fetched(uri: str, size: int) -> None:
    """Called by the adapter after each read of ``size`` bytes (a dict update: always on)."""
    with _lock:
        done, reads = _fetched.get(uri, (0, 0))
        _fetched[uri] = (done + size, reads + 1)


def register(con: duckdb.DuckDBPyConnection) -> None:
    """Let this DuckDB read ``s3://`` objects (before it is confined: a confined DuckDB registers
    nothing). Where DuckDB's httpfs extension is loaded it reads them itself."""
    if _httpfs_loaded(con):
        return
    try:
        adapter = _adapter()
    except ImportError:  # without the [s3] extra: DuckDB says it cannot read s3:// when asked to
        return
    con.register_filesystem(adapter)
    con.execute(f"SET GLOBAL parquet_prefetch_column_gap = {PREFETCH_GAP}")  # its cursors too
    # DuckDB's external file cache copies every read of a remote file into blocks of its buffer
    # pool, and the adapter cannot give it a version to keep them by across queries (it gets no
    # ETag through fsspec), so it pays the copy in CPU for nothing.
    con.execute("SET GLOBAL enable_external_file_cache = false")


def _httpfs_loaded(con: duckdb.DuckDBPyConnection) -> bool:
    rows = con.execute("SELECT loaded FROM duckdb_extensions() WHERE extension_name = 'httpfs'").fetchall()
    return bool(rows and rows[0][0])


@functools.cache
def _adapter() -> Any:
    """One fsspec filesystem per process (DuckDB keeps the object it is given)."""
    from duckflock.storage.fsspec_s3 import ObjectFileSystem

    return ObjectFileSystem()


def check_opened(uri: str, size: int, etag: str) -> bool:
    """Called by the adapter when DuckDB opens an object: refuse one replaced since registration.
    Whether it was expected (and is now checked until it is expected again)."""
    with _lock:
        _opened[0] += 1
        want = _expected.get(uri)
    if want is None:
        return False
    if (want.etag and etag and want.etag != etag) or want.size != size:
        raise ObjectError(
            f"object {uri} changed after it was registered (ETag {want.etag} -> {etag}, "
            f"{want.size} -> {size} bytes): load the table again"
        )
    with _lock:
        _checked.add(uri)
    return True


# ---- writing results ------------------------------------------------------------------------------------


def upload(local: str | os.PathLike[str], uri: str) -> None:
    """Copy a local file to ``uri`` (a single PUT or multipart: readers see it whole or not at all).
    The stream is closed here, not by pyarrow's ``copy_files``, whose close ignores a failed last
    part (the object is then not written, and nothing says so)."""
    bucket, key = split(uri)
    try:
        with open(local, "rb") as src, filesystem().open_output_stream(f"{bucket}/{key}") as out:
            shutil.copyfileobj(src, out, WRITE_BYTES)
    except Exception as e:
        raise _failed(f"cannot write object {uri}", e) from None


def put_bytes(uri: str, data: bytes) -> None:
    bucket, key = split(uri)
    try:
        with filesystem().open_output_stream(f"{bucket}/{key}") as out:
            out.write(data)
    except Exception as e:
        raise _failed(f"cannot write object {uri}", e) from None


def get_bytes(uri: str) -> bytes:
    bucket, key = split(uri)
    try:
        with filesystem().open_input_stream(f"{bucket}/{key}") as f:
            return bytes(f.read())
    except FileNotFoundError:
        raise ObjectError(f"object {uri} does not exist") from None
    except Exception as e:
        raise _failed(f"cannot read object {uri}", e) from None


def delete(uri: str) -> None:
    bucket, key = split(uri)
    try:
        filesystem().delete_file(f"{bucket}/{key}")
    except FileNotFoundError:
        pass
    except Exception as e:
        raise _failed(f"cannot delete object {uri}", e) from None


def drop_empty_markers(fs: pafs.FileSystem, path: str) -> None:
    """pyarrow keeps an emptied S3 "directory" by writing a marker object (``dir/``) in its parent:
    remove such markers with nothing under them, from ``path`` (``bucket/key``) up to the bucket."""
    import pyarrow.fs as pafs

    while "/" in path:  # not the bucket itself
        if fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)):
            return  # other objects live here
        if fs.get_file_info(path).type != pafs.FileType.Directory:
            return  # no marker
        fs.delete_dir(path)  # may write the parent's marker: the next round removes it
        path = path.rpartition("/")[0]


def drop_markers_of(prefix: str) -> None:
    """drop_empty_markers for an ``s3://bucket/prefix/`` (best effort: a marker is no object)."""
    bucket, key = split(prefix)
    with contextlib.suppress(Exception):
        drop_empty_markers(filesystem(), f"{bucket}/{key}".rstrip("/"))


def names_under(prefix: str) -> Sequence[str]:
    """The names (relative to ``prefix``) of the objects directly under it."""
    return [u[len(prefix) :] for u, _ in listing(prefix) if "/" not in u[len(prefix) :]]
