"""`duckflock load --partition-by` from objects, as a user runs it: 2 MPI ranks read their shares of
the objects, shuffle the rows by key and write the partitions into the data directory or as objects
(--output s3://...); the tables then answer as DuckDB over the source files, grouped and joined on
the key without an exchange. A load that fails leaves no table and no object."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import duckdb
import pytest

from duckflock.catalog import Catalog
from s3_support import bucket, upload_tree
from support import assert_same, run_on_ranks

pytestmark = pytest.mark.dist

BUCKET = "loads"
LIVENESS_S = 60  # a failing load ends well within this (its ranks start in a few seconds)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "duckflock.cli.main", *args], capture_output=True, text=True, timeout=180
    )


def keys(s3, prefix: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The objects under ``prefix``, without pyarrow's empty directory markers (``dir/``): its S3
    filesystem writes one in the parent of an object it deletes, here the load's lease."""
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return [o["Key"] for o in listed if not o["Key"].endswith("/")]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """Five Parquet objects of different sizes, keys overlapping across them; the local copies."""
    src = tmp_path_factory.mktemp("src")
    con = duckdb.connect()
    for i in range(5):
        con.execute(
            f"COPY (SELECT (r * 7 + {i}) % 1000 AS k, r AS v, 'f{i}-' || (r % 13) AS s "
            f"FROM range({3000 + 2000 * i}) t(r)) TO '{src}/part{i}.parquet' (FORMAT parquet)"
        )
    with bucket(BUCKET) as c:  # the ranks inherit its environment
        upload_tree(c, src, BUCKET, "raw")
        yield c, src


def test_load_from_objects_to_local_and_to_objects_matches_duckdb(s3, tmp_path):
    client, src = s3
    data = tmp_path / "data"
    load = [
        "load",
        "--data",
        str(data),
        "--ranks",
        "2",
        f"s3://{BUCKET}/raw/*.parquet",
        "--partition-by",
        "k",
    ]
    for table, extra in (
        ("here", []),
        ("there", ["--output", f"s3://{BUCKET}/tables/there/"]),
        ("ranged", ["--scheme", "range", "--output", f"s3://{BUCKET}/tables/ranged/"]),
    ):
        proc = cli(*load, "--table", table, "--partitions", "6", *extra)
        assert proc.returncode == 0, proc.stderr
        assert f"loaded {table}: 35000 rows in 6 partitions" in proc.stdout
    catalog = Catalog.load(data)
    there = catalog.table("there")
    assert there.kind == "hash" and all(len(p.files) == 1 for p in there.partitions)
    assert sorted(keys(client, "tables/there/")) == sorted(u.split("/", 3)[3] for u in there.object_uris())
    assert catalog.table("ranged").kind == "range"

    queries = [
        "SELECT k, count(*) AS n, sum(v) AS sv FROM there GROUP BY k",
        "SELECT a.k, count(*) AS n, sum(b.v) AS sv FROM there a JOIN here b ON a.k = b.k GROUP BY a.k",
        "SELECT k, min(s) AS s, count(*) AS n FROM ranged WHERE k BETWEEN 100 AND 300 GROUP BY k",
    ]
    ref = duckdb.connect()
    for t in ("here", "there", "ranged"):
        ref.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{src}/part*.parquet')")
    for q, got in zip(queries, run_on_ranks(data, 2, queries, tmp_path / "out"), strict=True):
        assert not isinstance(got, str), got
        assert_same(got, ref.sql(q).to_arrow_table())
    for q in queries[:2]:  # placed by the key: grouped and joined where the rows lie
        proc = cli("explain", "--data", str(data), "--ranks", "2", q)
        assert set(re.findall(r"; output (\w+)", proc.stdout)) == {"gather", "result"}, proc.stdout


def test_failed_load_to_objects_leaves_nothing(s3, tmp_path):
    client, _ = s3
    data = tmp_path / "data"
    load = ["load", "--data", str(data), "--ranks", "2", "--table", "t", f"s3://{BUCKET}/raw/*.parquet"]
    for extra, cause in (
        (["--partition-by", "nokey", "--output", f"s3://{BUCKET}/tables/t/"], "no column 'nokey'"),
        (["--partition-by", "k", "--output", "s3://no-such-bucket/t/"], "s3://no-such-bucket/t/"),
    ):
        t0 = time.monotonic()
        proc = cli(*load, *extra)
        assert time.monotonic() - t0 < LIVENESS_S
        assert proc.returncode == 1 and cause in proc.stderr, proc.stderr
        assert proc.stderr.count("error:") == 1 and "Traceback" not in proc.stderr
    assert not (data / "duckflock_catalog.json").exists() and keys(client, "tables/t/") == []
    proc = cli(*load, "--output", f"s3://{BUCKET}/tables/t/")
    assert proc.returncode == 1 and "--output is where --partition-by writes" in proc.stderr, proc.stderr
