"""Lake tables whose files are objects (moto's S3 server): hive directories registered with a hive
partitioning key, a Delta table and an Iceberg table with their warehouse in the bucket. Each
answer equals DuckDB's (or the format's own reader's) over the same data; hive joins on the key run
co-located."""

from __future__ import annotations

import time

import duckdb
import pyarrow as pa
import pytest
from test_ingest_load import QID, load, run_ranks
from test_lake_tables import assert_no_shuffle, compare, write

import duckflock
import duckflock.errors
from duckflock.catalog import Catalog
from duckflock.ingest.delta import load_delta
from duckflock.ingest.iceberg import load_iceberg
from duckflock.ingest.lake import delta_storage_options, iceberg_properties
from s3_support import bucket, upload_tree
from support import assert_same

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]  # slow: outside `make test-fast`

BUCKET = "lakes"


@pytest.fixture(scope="module")
def s3():
    with bucket(BUCKET) as c:
        yield c


def test_hive_objects_join_co_located_and_match_duckdb(s3, tmp_path):
    local = tmp_path / "hive"
    con = duckdb.connect()
    for k in range(6):
        write(con, local / f"a/k={k}/p0.parquet", f"SELECT r AS id, r % 5 AS g FROM range({10 + k}) t(r)")
    write(con, local / "a/k=__HIVE_DEFAULT_PARTITION__/p0.parquet", "SELECT 7::BIGINT AS id, 1::BIGINT AS g")
    for k in range(3, 9):
        write(con, local / f"b/k={k}/p0.parquet", f"SELECT r AS x FROM range({k}) t(r)")
    upload_tree(s3, local, BUCKET, "hive")
    root = tmp_path / "data"
    for t in "ab":
        info = load(2, root, t, [f"s3://{BUCKET}/hive/{t}/*/*.parquet"], hive_key="k", partitions=4)
        assert info.kind == "hash" and info.keys == ("k",) and info.hash_is_current()
        assert info.objects and all(u.startswith(f"s3://{BUCKET}/hive/{t}/") for u, *_ in info.objects)
    ref = duckdb.connect()
    for t in "ab":
        ref.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{local}/{t}/*/*.parquet')")
    joins = [
        "SELECT a.k, count(*) AS n, sum(a.id) AS s, sum(b.x) AS sx FROM a JOIN b ON a.k = b.k GROUP BY a.k",
        "SELECT k, count(*) AS n, count(DISTINCT g) AS dg FROM a GROUP BY k",
    ]
    compare(root, 2, joins, ref)
    assert_no_shuffle(root, 2, joins[0])


def test_delta_table_in_the_bucket_equals_deltalakes_read(s3, tmp_path):
    from deltalake import DeltaTable, write_deltalake

    uri = f"s3://{BUCKET}/delta/p"
    options = {**delta_storage_options(), "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}  # moto: no locking
    k = pa.array([i % 5 if i % 7 else None for i in range(40)], pa.int64())
    write_deltalake(
        uri,
        pa.table({"k": k, "v": [f"s{i}" for i in range(40)]}),
        partition_by=["k"],
        storage_options=options,
    )
    more = pa.table({"k": pa.array([1, 8], pa.int64()), "v": ["x", "y"], "w": [0.5, None]})
    write_deltalake(
        uri, more, mode="append", partition_by=["k"], schema_mode="merge", storage_options=options
    )
    root = tmp_path / "data"
    for name, version in (("p", None), ("p0", 0)):
        results, errors = run_ranks(2, lambda rt, n=name, v=version: load_delta(rt, QID, root, n, uri, v, 4))
        assert errors == [None, None], errors
        assert results[0].kind == "hash" and all(f.startswith("s3://") for f in results[0].object_uris())
    ref = duckdb.connect()
    for name, version in (("p", None), ("p0", 0)):
        ref.register(
            f"{name}_arrow", DeltaTable(uri, version=version, storage_options=options).to_pyarrow_table()
        )
        ref.execute(f"CREATE VIEW {name} AS SELECT * FROM {name}_arrow")
    compare(
        root,
        2,
        ["SELECT * FROM p", "SELECT * FROM p0", "SELECT k, count(*) AS n, count(w) AS nw FROM p GROUP BY k"],
        ref,
    )


def test_iceberg_warehouse_in_the_bucket_equals_its_scan(s3, tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    uri = f"sqlite:///{tmp_path}/cat.db"
    cat = SqlCatalog("default", uri=uri, warehouse=f"s3://{BUCKET}/wh", **iceberg_properties())
    cat.create_namespace("ns")
    rows = pa.table(
        {
            "k": pa.array([i % 6 if i % 8 else None for i in range(50)], pa.int64()),
            "v": [f"s{i % 4}" for i in range(50)],
        }
    )
    tbl = cat.create_table("ns.p", schema=rows.schema)
    with tbl.update_spec() as u:
        u.add_identity("k")
    tbl.append(rows)
    root = tmp_path / "data"
    results, errors = run_ranks(2, lambda rt: load_iceberg(rt, QID, root, "p", uri, "ns.p", None, 4))
    assert errors == [None, None], errors
    assert results[0].kind == "hash" and results[0].keys == ("k",)
    assert all(f.startswith(f"s3://{BUCKET}/wh/") for f in Catalog.load(root).table("p").object_uris())
    ref = duckdb.connect()
    ref.register("p_arrow", tbl.scan().to_arrow())
    ref.execute("CREATE VIEW p AS SELECT * FROM p_arrow")
    compare(root, 2, ["SELECT * FROM p", "SELECT k, count(*) AS n, min(v) AS mv FROM p GROUP BY k"], ref)


def test_delta_objects_replaced_or_gone_are_refused_naming_them(s3, tmp_path):
    """The objects of every version a query reads carry their ETag and size: one rewritten under
    its name after registration, or one removed, fails the query naming it, within the timeout."""
    from deltalake import DeltaTable, write_deltalake

    uri = f"s3://{BUCKET}/delta/r"
    options = {**delta_storage_options(), "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}
    write_deltalake(uri, pa.table({"k": pa.array(range(20), pa.int64())}), storage_options=options)
    root = tmp_path / "data"
    _, errors = run_ranks(2, lambda rt: load_delta(rt, QID, root, "r", uri, None, 2))
    assert errors == [None, None], errors
    assert Catalog.load(root).table("r").objects  # stamped
    with duckflock.connect(str(root), ranks=2, transport="threads") as db:
        write_deltalake(
            uri, pa.table({"k": pa.array([100, 101], pa.int64())}), mode="append", storage_options=options
        )
        ref = DeltaTable(uri, storage_options=options).to_pyarrow_table()
        assert_same(db.sql("SELECT * FROM r").arrow(), ref)  # the new version's object stamped here
        first = DeltaTable(uri, version=0, storage_options=options).file_uris()[0]
        added = next(u for u in DeltaTable(uri, storage_options=options).file_uris() if u != first)
        start = time.monotonic()
        s3.delete_object(Bucket=BUCKET, Key=added.removeprefix(f"s3://{BUCKET}/"))
        with pytest.raises(duckflock.errors.DuckflockError) as gone:
            db.sql("SELECT count(*) FROM r")
        assert added in str(gone.value) and "table 'r' at Delta version 1" in str(gone.value)
        key = first.removeprefix(f"s3://{BUCKET}/")
        s3.put_object(
            Bucket=BUCKET, Key=key, Body=s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() + b"x"
        )
        with pytest.raises(duckflock.errors.DuckflockError, match=f"{first} changed after it was registered"):
            db.sql("SELECT * FROM r VERSION AS OF 0")
        assert time.monotonic() - start < 60
