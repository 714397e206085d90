"""Tables registered in place on S3-compatible storage (moto's server), queried on 2 ranks as
threads; results written to objects; bad input fails fast with a message naming the object."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from test_ingest_load import QID, run_ranks

import duckflock
from duckflock.catalog import Catalog
from duckflock.errors import DuckflockError
from duckflock.ingest.load import load_table, repartition_table
from duckflock.local_duckdb import open_duckdb
from duckflock.testing.tpch import ORDER, queries
from s3_support import bucket, moto_process, opened, s3_env, silent_server, upload_tree
from support import assert_same, oracle

pytestmark = pytest.mark.slow  # minutes: outside `make test-fast`

BUCKET = "lake"
LIVENESS_S = 30  # every bad-input case fails well within this


@pytest.fixture(scope="module")
def s3():
    with bucket(BUCKET) as c:
        yield c


def register(root: Path, name: str, files: list[str], ranks: int = 2, **kw) -> None:
    _, errors = run_ranks(ranks, lambda rt: load_table(rt, QID, root, name, files, **kw))
    assert errors == [None] * ranks, errors


def failure(root: Path, name: str, files: list[str], **kw) -> str:
    t0 = time.monotonic()
    _, errors = run_ranks(2, lambda rt: load_table(rt, QID, root, name, files, **kw))
    assert time.monotonic() - t0 < LIVENESS_S
    assert errors[0] is not None
    return str(errors[0])


@pytest.fixture(scope="module")
def tpch_on_s3(s3, tpch_dir, tmp_path_factory):
    """TPC-H SF 0.01 uploaded as it is, then registered in place (no copy) in a new data directory."""
    root = tmp_path_factory.mktemp("s3cat")
    for table in Catalog.load(tpch_dir).tables:
        upload_tree(s3, tpch_dir / table, BUCKET, f"tpch/{table}")
        register(root, table, [f"s3://{BUCKET}/tpch/{table}/*.parquet"])
    return root


def test_tables_are_registered_in_place(tpch_on_s3, tpch_dir):
    catalog = Catalog.load(tpch_on_s3)
    info = catalog.table("lineitem")
    assert all(f.startswith(f"s3://{BUCKET}/tpch/lineitem/") for p in info.partitions for f in p.files)
    assert catalog.path(info.partitions[0].files[0]) == info.partitions[0].files[0]
    assert {u for u, _, _ in info.objects} == set(info.object_uris())
    assert all(etag and size for _, size, etag in info.objects)
    size_of = {u: n for u, n, _ in info.objects}
    sizes = [size_of[u] for u in info.object_uris()]
    assert sizes == sorted(sizes, reverse=True)  # dealt round-robin: about even bytes per rank
    assert info.rows == Catalog.load(tpch_dir).table("lineitem").rows
    assert not (tpch_on_s3 / "lineitem").exists()  # nothing copied


def test_tpch_22_from_objects_match_duckdb(tpch_on_s3, tpch_dir):
    ref = oracle(tpch_dir)
    failures = []
    with duckflock.connect(str(tpch_on_s3), ranks=2, transport="threads") as db:
        for n, q in queries().items():
            try:
                assert_same(db.sql(q).arrow(), ref.sql(q).to_arrow_table(), ORDER.get(n))
            except (AssertionError, DuckflockError) as e:
                failures.append(f"Q{n}: {str(e)[:300]}")
    assert not failures, "\n".join(failures)


def test_confined_rank_reads_only_the_catalogs_prefixes(tpch_on_s3, tmp_path):
    prefixes = Catalog.load(tpch_on_s3).object_prefixes()
    assert f"s3://{BUCKET}/tpch/nation/" in prefixes
    con = open_duckdb(1, 256 << 20, str(tpch_on_s3), str(tmp_path), object_prefixes=prefixes)
    assert con.sql(
        f"SELECT count(*) FROM read_parquet('s3://{BUCKET}/tpch/nation/*.parquet')"
    ).fetchall() == [(25,)]
    with pytest.raises(duckdb.Error, match=r"disabled by configuration|not allowed|Permission"):
        con.sql(f"SELECT count(*) FROM read_parquet('s3://{BUCKET}/elsewhere/x.parquet')").fetchall()


@pytest.fixture(scope="module")
def hive_local(tmp_path_factory):
    """Rows partitioned by year and kind, with NULL years (``year=__HIVE_DEFAULT_PARTITION__``)."""
    out = tmp_path_factory.mktemp("hive")
    duckdb.sql(
        "COPY (SELECT r AS id, CASE WHEN r % 5 = 0 THEN NULL ELSE 2020 + r % 4 END AS year, "
        f"['a', 'b'][1 + r % 2] AS kind, r * 1.5 AS v FROM range(400) t(r)) TO '{out}' "
        "(FORMAT parquet, PARTITION_BY (year, kind))"
    )
    assert list(out.glob("year=__HIVE_DEFAULT_PARTITION__/*/*.parquet"))
    return out


def test_hive_objects_with_null_partition_match_duckdb_and_prune(s3, hive_local, tmp_path):
    upload_tree(s3, hive_local, BUCKET, "events")
    register(tmp_path, "events", [f"s3://{BUCKET}/events/**/*.parquet"])
    info = Catalog.load(tmp_path).table("events")
    assert dict(info.hive or ()).keys() == {"year", "kind"}
    local = f"read_parquet('{hive_local}/**/*.parquet', hive_partitioning = true)"
    checks = {
        "SELECT year, kind, count(*) AS n, sum(v) AS s FROM {t} GROUP BY ALL": None,
        "SELECT count(*) AS n FROM {t} WHERE year IS NULL": None,
        "SELECT id FROM {t} WHERE year = 2021 AND kind = 'b'": None,
        "SELECT id FROM {t} WHERE year IN (2020, 2023) OR v > 500": None,
        "SELECT id FROM {t} WHERE year BETWEEN 2021 AND 2022": None,
    }
    with duckflock.connect(str(tmp_path), ranks=2, transport="threads") as db:
        for q in checks:
            assert_same(db.sql(q.format(t="events")).arrow(), duckdb.sql(q.format(t=local)).to_arrow_table())
        total = len(info.object_uris())
        before = opened()
        db.sql("SELECT count(*) FROM events WHERE year = 2021 AND kind = 'b'").arrow()
        pruned = opened() - before
        before = opened()
        db.sql("SELECT count(*) FROM events WHERE v > 0").arrow()
        unpruned = opened() - before
    # DuckDB opens each object it reads more than once (binding, scanning): one object's worth of
    # opens against all of them, for the one (year, kind) directory that matches.
    assert unpruned >= total and 0 < pruned * total <= unpruned, (pruned, unpruned, total)


@pytest.fixture(scope="module")
def events(s3, hive_local) -> str:
    """The hive rows as objects: their glob."""
    upload_tree(s3, hive_local, BUCKET, "events")
    return f"s3://{BUCKET}/events/**/*.parquet"


def exchanges(db, sql: str) -> set[str]:  # type: ignore[no-untyped-def]
    """The kinds of the outputs of the query's stages (gather and result: no exchange between ranks)."""
    return set(re.findall(r"; output (\w+)", db.explain(sql)))


def test_repartition_from_objects_to_local_and_to_objects(s3, events, hive_local, tmp_path):
    register(tmp_path, "ev", [events], partition_by=["id"], partitions=4)
    register(tmp_path, "ev3", [events], partition_by=["id"], partitions=4, output=f"s3://{BUCKET}/tables/ev3")
    local, there = Catalog.load(tmp_path).table("ev"), Catalog.load(tmp_path).table("ev3")
    assert local.kind == there.kind == "hash" and local.rows == there.rows == 400
    # Rows were shuffled to the rank owning their partition: one file per (non-empty) partition.
    assert all(len(p.files) == 1 and not p.files[0].startswith("s3://") for p in local.partitions)
    assert all(len(p.files) == 1 for p in there.partitions)
    uris = there.object_uris()
    assert all(u.startswith(f"s3://{BUCKET}/tables/ev3/part-") for u in uris)
    assert sorted(u for u, _, _ in there.objects) == sorted(uris) == _keys(s3, "tables/ev3/", uri=True)
    assert all(etag and size for _, size, etag in there.objects)
    assert there.source == {"written_to": f"s3://{BUCKET}/tables/ev3/"} and not (tmp_path / "ev3").exists()
    source = f"read_parquet('{hive_local}/**/*.parquet', hive_partitioning = true)"
    checks = [
        "SELECT kind, year, count(*) AS n, sum(id) AS s FROM {t} GROUP BY ALL",
        "SELECT id, count(*) AS n, max(v) AS v FROM {t} GROUP BY id",
        "SELECT a.id, a.kind, b.v FROM {t} a JOIN {u} b ON a.id = b.id WHERE a.year IS NULL",
    ]
    with duckflock.connect(str(tmp_path), ranks=2, transport="threads") as db:
        for q in checks:
            expected = duckdb.sql(q.format(t=source, u=source)).to_arrow_table()
            for t, u in (("ev", "ev"), ("ev3", "ev3"), ("ev3", "ev")):
                assert_same(db.sql(q.format(t=t, u=u)).arrow(), expected)
        # Placed by the key as local partitioned tables are: grouped and joined where they lie.
        assert exchanges(db, checks[1].format(t="ev3")) == {"gather", "result"}
        assert exchanges(db, checks[2].format(t="ev3", u="ev")) == {"gather", "result"}


def test_reloading_an_object_table_removes_its_old_objects(s3, events, tmp_path):
    out = f"s3://{BUCKET}/tables/again/"
    register(tmp_path, "again", [events], partition_by=["kind"], partitions=3, output=out)
    first = Catalog.load(tmp_path).table("again").object_uris()
    register(tmp_path, "again", [events], partition_by=["id"], partitions=2, output=out)
    second = Catalog.load(tmp_path).table("again").object_uris()
    assert not set(first) & set(second) and _keys(s3, "tables/again/", uri=True) == sorted(second)
    register(tmp_path, "again", [events], partition_by=["id"], partitions=2)  # now local
    assert _keys(s3, "tables/again/") == []


def _keys(s3, prefix: str, uri: bool = False) -> list[str]:
    """The keys under ``prefix`` (pyarrow's "directory" markers, ``dir/``, left out), or their URIs."""
    found = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    keys = sorted(o["Key"] for o in found if not o["Key"].endswith("/"))
    return [f"s3://{BUCKET}/{k}" for k in keys] if uri else keys


def test_results_to_objects_commit_with_success_last(s3, tpch_on_s3, tpch_dir, tmp_path):
    q = "SELECT o_orderkey, o_totalprice FROM orders WHERE o_orderkey % 7 = 0"
    expected = oracle(tpch_dir).sql(q).to_arrow_table()
    with duckflock.connect(str(tpch_on_s3), ranks=2, transport="threads") as db:
        db.sql(q, output=f"s3://{BUCKET}/out/r1/")
        keys = _keys(s3, "out/r1/")
        assert "out/r1/_SUCCESS" in keys and len(keys) >= 2
        parts = [k for k in keys if k.endswith(".parquet")]
        for k in parts:
            s3.download_file(BUCKET, k, str(tmp_path / k.rsplit("/", 1)[1]))
        got = pq.read_table([tmp_path / k.rsplit("/", 1)[1] for k in parts])
        assert_same(got, expected)
        db.sql(q, output=f"s3://{BUCKET}/out/one.parquet")
        s3.download_file(BUCKET, "out/one.parquet", str(tmp_path / "one.parquet"))
        assert_same(pq.read_table(tmp_path / "one.parquet"), expected)
        # Again into the same prefix, failing: the earlier marker is gone and no new one appears.
        with pytest.raises(DuckflockError):
            db.sql(
                "SELECT o_orderkey / (o_orderkey - 7) :: INTEGER FROM orders WHERE error('boom') IS NULL",
                output=f"s3://{BUCKET}/out/r1/",
            )
        assert "out/r1/_SUCCESS" not in _keys(s3, "out/r1/")


# ---- bad input: every case fails within LIVENESS_S, naming the object ----------------------------------


def test_missing_bucket_key_and_glob(s3, tmp_path):
    assert "does not exist" in failure(tmp_path, "t", [f"s3://{BUCKET}/nothing/here.parquet"])
    assert "no object matches" in failure(tmp_path, "t", [f"s3://{BUCKET}/nothing/*.parquet"])
    message = failure(tmp_path, "t", ["s3://no-such-bucket/x/*.parquet"])
    assert "s3://no-such-bucket/x/" in message


def test_corrupt_footer_names_the_object(s3, tmp_path):
    s3.put_object(Bucket=BUCKET, Key="bad/x.parquet", Body=b"PAR1 not a parquet file at all PAR1")
    message = failure(tmp_path, "t", [f"s3://{BUCKET}/bad/x.parquet"])
    assert f"s3://{BUCKET}/bad/x.parquet" in message


def test_object_replaced_or_deleted_after_load_is_refused(s3, tpch_dir, tmp_path):
    src = next((tpch_dir / "nation").glob("*.parquet"))
    s3.upload_file(str(src), BUCKET, "swap/nation.parquet")
    register(tmp_path, "nation", [f"s3://{BUCKET}/swap/nation.parquet"])
    duckdb.sql(f"COPY (SELECT * FROM '{src}' LIMIT 3) TO '{tmp_path}/small.parquet'")
    s3.upload_file(str(tmp_path / "small.parquet"), BUCKET, "swap/nation.parquet")
    with duckflock.connect(str(tmp_path), ranks=2, transport="threads") as db:
        t0 = time.monotonic()
        with pytest.raises(DuckflockError, match=f"s3://{BUCKET}/swap/nation.parquet changed"):
            db.sql("SELECT count(*) FROM nation").arrow()
        s3.delete_object(Bucket=BUCKET, Key="swap/nation.parquet")
        with pytest.raises(DuckflockError, match=f"s3://{BUCKET}/swap/nation.parquet"):
            db.sql("SELECT count(*) FROM nation").arrow()
        assert time.monotonic() - t0 < LIVENESS_S


def test_object_replaced_between_queries_is_refused_by_the_next(s3, tpch_dir, tmp_path):
    """An object is checked once a query (later opens in that query reuse its handle): one
    replaced after a query that read it is refused by the next query."""
    src = next((tpch_dir / "nation").glob("*.parquet"))
    s3.upload_file(str(src), BUCKET, "swap2/nation.parquet")
    register(tmp_path, "nation", [f"s3://{BUCKET}/swap2/nation.parquet"])
    duckdb.sql(f"COPY (SELECT * FROM '{src}' LIMIT 3) TO '{tmp_path}/small.parquet'")
    with duckflock.connect(str(tmp_path), ranks=2, transport="threads") as db:
        for _ in range(2):
            assert db.sql("SELECT count(*) AS n FROM nation").arrow().column("n").to_pylist() == [25]
        s3.upload_file(str(tmp_path / "small.parquet"), BUCKET, "swap2/nation.parquet")
        with pytest.raises(DuckflockError, match=f"s3://{BUCKET}/swap2/nation.parquet changed"):
            db.sql("SELECT count(*) FROM nation").arrow()


def test_wrong_credentials_and_silent_server_fail_fast(tmp_path):
    with silent_server() as endpoint, s3_env(endpoint, DUCKFLOCK_S3_TIMEOUT_S="1", DUCKFLOCK_S3_RETRIES="2"):
        message = failure(tmp_path, "t", [f"s3://{BUCKET}/tpch/nation/*.parquet"])
        assert f"s3://{BUCKET}/tpch/nation/" in message
    # moto checks keys only when asked to (INITIAL_NO_AUTH_ACTION_COUNT): its own process.
    with (
        moto_process({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as endpoint,
        s3_env(endpoint, AWS_ACCESS_KEY_ID="wrong"),
    ):
        message = failure(tmp_path, "t", [f"s3://{BUCKET}/tpch/*.parquet"])
        assert f"s3://{BUCKET}/tpch/" in message and "INVALID_ACCESS_KEY_ID" in message


def nothing_visible(root: Path, name: str) -> bool:
    return not (root / "duckflock_catalog.json").exists() or Catalog.load(root).find(name) is None


def test_failed_load_to_objects_leaves_no_table_and_no_object(s3, events, tmp_path):
    out = f"s3://{BUCKET}/tables/failed/"
    message = failure(tmp_path, "f", [events], partition_by=["nokey"], output=out)
    assert "no column 'nokey'" in message
    message = failure(tmp_path, "f", [events], partition_by=["id"], output="s3://no-such-bucket/t/")
    assert "s3://no-such-bucket/t/" in message and "bucket does not exist" in message
    # Every rank has uploaded its partitions when the catalog cannot be saved: they are removed.
    (tmp_path / "duckflock_catalog.json").write_text("{ not json")
    message = failure(tmp_path, "f", [events], partition_by=["id"], output=out)
    assert "not a JSON catalog" in message
    (tmp_path / "duckflock_catalog.json").unlink()
    assert nothing_visible(tmp_path, "f") and not (tmp_path / "f").exists()
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix="tables/failed")  # no marker either


def test_destination_without_access_or_credentials_fails_fast(hive_local, tmp_path):
    files = [str(f) for f in sorted(hive_local.glob("**/*.parquet"))]
    with moto_process({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as endpoint:
        cases = {
            "INVALID_ACCESS_KEY_ID": {"AWS_ACCESS_KEY_ID": "wrong"},
            "no AWS credentials are configured": {
                "AWS_ACCESS_KEY_ID": "",
                "AWS_SECRET_ACCESS_KEY": "",
                "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                "AWS_CONFIG_FILE": str(tmp_path / "none"),
            },
        }
        for cause, env in cases.items():
            with s3_env(endpoint, **env):
                message = failure(tmp_path, "t", files, partition_by=["id"], output=f"s3://{BUCKET}/t/")
            assert f"cannot write the table to s3://{BUCKET}/t/" in message and cause in message, message
            assert nothing_visible(tmp_path, "t")


def test_repartition_rewrites_an_object_table_under_its_prefix(s3, events, hive_local, tmp_path):
    out = f"s3://{BUCKET}/tables/stale/"
    register(tmp_path, "stale", [events], partition_by=["id"], partitions=3, output=out)
    path = tmp_path / "duckflock_catalog.json"
    catalog = json.loads(path.read_text())
    catalog["tables"]["stale"]["partitioning"].update(hash_canary=1, duckdb="0.0.1-other")
    path.write_text(json.dumps(catalog))  # as placed by a DuckDB whose hash() differs
    old = Catalog.load(tmp_path).table("stale").object_uris()
    _, errors = run_ranks(2, lambda rt: repartition_table(rt, QID, tmp_path, "stale"))
    assert errors == [None, None], errors
    info = Catalog.load(tmp_path).table("stale")
    assert info.hash_is_current() and not set(old) & set(info.object_uris())
    assert _keys(s3, "tables/stale/", uri=True) == sorted(info.object_uris())
    source = f"read_parquet('{hive_local}/**/*.parquet', hive_partitioning = true)"
    q = "SELECT id, kind, v FROM {t}"
    with duckflock.connect(str(tmp_path), ranks=2, transport="threads") as db:
        assert_same(db.sql(q.format(t="stale")).arrow(), duckdb.sql(q.format(t=source)).to_arrow_table())
