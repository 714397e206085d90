"""Scan accounting of a profiled query (exec/stages/scan_stats.py): files pruned by hive values, row groups
DuckDB skipped by their statistics, bytes fetched; on local Parquet and on objects (moto)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from test_ingest_load import QID, run_ranks

import duckflock
from duckflock.exec.reports import ScanStats, summed
from duckflock.ingest.load import load_table
from s3_support import client, moto_server, s3_env, upload_tree

BUCKET = "scans"
ROW_GROUPS = 4  # per file: 200k rows of each year, 50k per row group, sorted by id
YEAR = 200_000


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> Path:
    """4 hive directories (year=2020..2023), one file each of 4 row groups; a wide text column.
    Files of 3 MB: DuckDB reads a small object (under 1 MB) whole, several times, not by column."""
    out = tmp_path_factory.mktemp("events")
    con = duckdb.connect(config={"threads": 1})  # one file per year, its rows in order
    for year in range(2020, 2024):
        (out / f"year={year}").mkdir()
        first = (year - 2020) * YEAR
        con.execute(
            f"COPY (SELECT r AS id, r * 0.5 AS v, repeat('x', 40) || r AS pad FROM range({first}, "
            f"{first + YEAR}) t(r)) TO '{out}/year={year}/data.parquet' (FORMAT parquet, ROW_GROUP_SIZE 50000)"
        )
    return out


def register(root: Path, files: list[str]) -> None:
    _, errors = run_ranks(2, lambda rt: load_table(rt, QID, root, "ev", files))
    assert errors == [None, None], errors


def scans(root: Path, query: str) -> ScanStats:
    with duckflock.connect(str(root), ranks=2, transport="threads") as db:
        result = db.sql(query, profile=True)
    (found,) = summed([s.scans for s in result.stats])
    return found


PRUNED = f"SELECT sum(v) FROM ev WHERE year = 2021 AND id < {YEAR + 25_000}"  # 1 file, 1 row group


def check_pruned(found: ScanStats) -> None:
    assert (found.files_read, found.files_total) == (1, 4)
    assert (found.row_groups_read, found.row_groups_total) == (1, ROW_GROUPS)
    assert found.bytes_fetched is not None and 0 < found.bytes_fetched < found.bytes_total


def test_local_parquet_prunes_files_and_row_groups(events, tmp_path):
    register(tmp_path, [f"{events}/**/*.parquet"])
    check_pruned(scans(tmp_path, PRUNED))
    whole = scans(tmp_path, "SELECT sum(v) FROM ev")
    assert (whole.files_read, whole.row_groups_read) == (4, 4 * ROW_GROUPS)
    assert whole.describe().startswith("ev: 4/4 files, 16/16 row groups, ")


def test_objects_prune_and_count_bytes_fetched(events, tmp_path):
    with moto_server() as endpoint, s3_env(endpoint):
        s3 = client(endpoint)
        s3.create_bucket(Bucket=BUCKET)
        upload_tree(s3, events, BUCKET, "ev")
        register(tmp_path, [f"s3://{BUCKET}/ev/**/*.parquet"])
        projected = scans(tmp_path, "SELECT sum(v) FROM ev")  # not the wide column
        assert projected.objects and (projected.files_read, projected.files_total) == (4, 4)
        assert projected.bytes_fetched is not None and projected.reads, projected
        assert 0 < projected.bytes_fetched < projected.bytes_total / 2, projected.describe()
        check_pruned(scans(tmp_path, PRUNED))
        with duckflock.connect(str(tmp_path), ranks=2, transport="threads") as db:
            text = db.explain(PRUNED, analyze=True)
    assert "scans, all ranks: ev: 1/4 objects, 1/4 row groups, " in text, text


def test_object_file_offset_is_each_threads_own():
    """DuckDB's threads share a handle: one's seek must not move where another reads."""
    import threading

    from duckflock.storage.fsspec_s3 import ObjectFile

    class Raw:
        def size(self) -> int:
            return 100

        def read_at(self, n: int, at: int) -> bytes:
            return bytes(range(at, at + n))

    f = ObjectFile(Raw(), "s3://b/k")
    f.seek(10)
    other = threading.Thread(target=lambda: (f.seek(95), f.read(5)))
    other.start()
    other.join()
    assert f.read(3) == bytes([10, 11, 12]) and f.tell() == 13


def test_an_object_is_checked_once_a_query_whatever_stages_expect_it():
    """Each stage expects its tables' stamps; the HEAD request checking an object is made by the
    first open in a query, again only in the next query or for another stamp."""
    from duckflock.storage import objects

    uri = "s3://b/checked-once"
    stamp = objects.Stamp(uri, 10, "e1")
    objects.begin_query()
    objects.expect([stamp])
    assert not objects.opening(uri)  # the first open checks it
    assert objects.check_opened(uri, 10, "e1")
    objects.expect([stamp])  # the query's next stage
    assert objects.opening(uri)
    objects.begin_query()  # the next query checks it again
    objects.expect([stamp])
    assert not objects.opening(uri)
    assert objects.check_opened(uri, 10, "e1")
    objects.expect([objects.Stamp(uri, 10, "e2")])  # registered again since: checked again
    assert not objects.opening(uri)
    with pytest.raises(objects.ObjectError, match="changed after it was registered"):
        objects.check_opened(uri, 10, "e1")
