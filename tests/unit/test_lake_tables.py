"""Tables registered in place from their own layout (ingest/lake.py): hive directories, Delta Lake and
Iceberg tables. Every answer is compared with single-process DuckDB over the same data, read
independently of duckflock's catalog; joins on the partition key must run without a shuffle."""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from test_ingest_load import QID, load, run_ranks

import duckflock
from duckflock.catalog import Catalog, Hashed
from duckflock.errors import CatalogError
from duckflock.ingest.delta import load_delta
from duckflock.ingest.iceberg import load_iceberg
from support import assert_same

pytestmark = pytest.mark.timeout(120)

JOINS = [
    "SELECT a.k, count(*) AS n, sum(a.id) AS s, sum(b.x) AS sx FROM a JOIN b ON a.k = b.k GROUP BY a.k",
    "SELECT k, count(*) AS n, count(DISTINCT g) AS dg FROM a GROUP BY k",
    "SELECT a.k, count(*) AS n, sum(c.w) AS sw FROM a JOIN c ON a.k = c.k GROUP BY a.k",
    "SELECT count(*) AS n FROM a LEFT JOIN b USING (k) WHERE b.x IS NULL",
]


def compare(root: Path, ranks: int, queries: list[str], ref: duckdb.DuckDBPyConnection) -> None:
    with duckflock.connect(str(root), ranks=ranks, transport="threads") as db:
        for q in queries:
            assert_same(db.sql(q).arrow(), ref.sql(q).to_arrow_table())


def assert_no_shuffle(root: Path, ranks: int, query: str) -> None:
    with duckflock.connect(str(root), ranks=ranks, transport="threads") as db:
        plan = db.explain(query)
    assert "co-located" in plan and "output hash" not in plan, plan


def write(con: duckdb.DuckDBPyConnection, path: Path, query: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    con.execute(f"COPY ({query}) TO '{path}' (FORMAT parquet)")


@pytest.fixture(scope="module")
def hive_files(tmp_path_factory) -> Path:
    """Table a: values 0-7, two files per value (the second of k=0 empty), a NULL partition; b: values
    3-11 and NULL; c: plain files with a column k, to be repartitioned by duckflock."""
    raw = tmp_path_factory.mktemp("hive")
    con = duckdb.connect()
    for k in range(8):
        write(con, raw / f"a/k={k}/p0.parquet", f"SELECT r AS id, r % 5 AS g FROM range({10 + k}) t(r)")
        write(con, raw / f"a/k={k}/p1.parquet", f"SELECT r + 100 AS id, r % 3 AS g FROM range({k}) t(r)")
    write(con, raw / "a/k=__HIVE_DEFAULT_PARTITION__/p0.parquet", "SELECT 7::BIGINT AS id, 1::BIGINT AS g")
    for k in range(3, 12):
        write(con, raw / f"b/k={k}/p0.parquet", f"SELECT r AS x FROM range({k}) t(r)")
    write(con, raw / "b/k=__HIVE_DEFAULT_PARTITION__/p0.parquet", "SELECT 5::BIGINT AS x")
    write(con, raw / "c.parquet", "SELECT (r % 15)::INTEGER AS k, r AS w FROM range(300) t(r)")
    return raw


@pytest.mark.parametrize("ranks", [2, 3])
def test_hive_tables_join_co_located(tmp_path, hive_files, ranks):
    root = tmp_path / "data"
    for t in "ab":
        info = load(2, root, t, [f"{hive_files}/{t}/*/*.parquet"], hive_key="k", partitions=4)
        assert info.kind == "hash" and info.keys == ("k",) and len(info.partitions) == 4
        assert info.hash_is_current() and isinstance(info.partitioning(), Hashed)
    assert any(p.rows == 0 for p in Catalog.load(root).table("b").partitions)  # an empty partition
    load(2, root, "c", [str(hive_files / "c.parquet")], partition_by=["k"], partitions=4)
    ref = duckdb.connect()
    for t in "ab":
        ref.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{hive_files}/{t}/*/*.parquet')")
    ref.execute(f"CREATE VIEW c AS SELECT * FROM '{hive_files}/c.parquet'")
    compare(root, ranks, JOINS, ref)
    for q in (JOINS[0], JOINS[2]):
        assert_no_shuffle(root, ranks, q)


def test_hive_key_that_is_not_a_hive_column_leaves_the_table_unpartitioned(tmp_path, hive_files):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info = load(2, tmp_path, "a", [f"{hive_files}/a/*/*.parquet"], hive_key="g")
    assert info.kind == "none" and info.rows == sum(10 + 2 * k for k in range(8)) + 1
    assert any("not a hive partition column" in str(w.message) for w in caught)


# ---- Delta Lake ----------------------------------------------------------------------------------


def delta_reference(uri: Path, version: int | None = None) -> pa.Table:
    from deltalake import DeltaTable

    return DeltaTable(str(uri), version=version).to_pyarrow_table()


@pytest.fixture(scope="module")
def delta_tables(tmp_path_factory) -> Path:
    """Delta tables: ``p`` partitioned on k (a NULL partition, a column w added by version 1),
    ``u`` unpartitioned in three versions, ``q`` partitioned on k like p for the join."""
    from deltalake import write_deltalake

    base = tmp_path_factory.mktemp("delta")
    k = pa.array([i % 7 if i % 10 else None for i in range(60)], pa.int64())
    write_deltalake(
        base / "p", pa.table({"k": k, "v": pa.array([f"s{i % 9}" for i in range(60)])}), partition_by=["k"]
    )
    more = pa.table({"k": pa.array([1, 2, 9], pa.int64()), "v": ["x", "y", "z"], "w": [1.5, 2.5, None]})
    write_deltalake(base / "p", more, mode="append", partition_by=["k"], schema_mode="merge")
    for i in range(3):
        rows = pa.table(
            {
                "id": pa.array(range(i * 40, i * 40 + 40), pa.int64()),
                "k": pa.array([j % 11 for j in range(40)], pa.int64()),
            }
        )
        write_deltalake(base / "u", rows, mode="append")
    q = pa.table({"k": pa.array(range(12), pa.int64()), "x": pa.array(range(100, 112), pa.int64())})
    write_deltalake(base / "q", q, partition_by=["k"])
    return base


@pytest.mark.parametrize("ranks", [2, 4])
def test_delta_tables_as_of_a_version_equal_their_files(tmp_path, delta_tables, ranks):
    root = tmp_path / "data"
    loads = [("p", "p", None), ("p0", "p", 0), ("u", "u", None), ("u1", "u", 1), ("q", "q", None)]
    for name, path, version in loads:
        results, errors = run_ranks(
            2, lambda rt, n=name, p=path, v=version: load_delta(rt, QID, root, n, str(delta_tables / p), v, 4)
        )
        assert errors == [None, None], errors
        info = results[0]
        assert info.source["version"] == (version if version is not None else info.source["version"])
        assert info.kind == ("hash" if path in "pq" else "none")
    catalog = Catalog.load(root)
    assert sorted(c for c, _ in catalog.table("p").columns) == ["k", "v", "w"]  # Delta's order
    assert [c for c, _ in catalog.table("p0").columns] == ["k", "v"]
    ref = duckdb.connect()
    for name, path, version in loads:
        ref.register(f"{name}_arrow", delta_reference(delta_tables / path, version))
        ref.execute(f"CREATE VIEW {name} AS SELECT * FROM {name}_arrow")
    queries = [
        "SELECT * FROM p",
        "SELECT * FROM p0",
        "SELECT k, count(*) AS n, count(w) AS nw, min(v) AS mv FROM p GROUP BY k",
        "SELECT p.k, count(*) AS n, sum(q.x) AS sx FROM p JOIN q ON p.k = q.k GROUP BY p.k",
        "SELECT * FROM u",
        "SELECT k, count(*) AS n, sum(id) AS s FROM u1 GROUP BY k",
    ]
    compare(root, ranks, queries, ref)
    assert_no_shuffle(root, ranks, queries[3])


def test_delta_refusals_are_quick_and_name_the_cause(tmp_path, delta_tables):
    gone = tmp_path / "gone"
    shutil.copytree(delta_tables / "u", gone)
    victim = sorted(gone.glob("*.parquet"))[0]
    victim.unlink()
    dv = tmp_path / "dv"
    shutil.copytree(delta_tables / "q", dv)
    log = dv / "_delta_log" / "00000000000000000000.json"
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    for a in actions:
        if "protocol" in a:
            a["protocol"] = {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": ["deletionVectors"],
                "writerFeatures": ["deletionVectors"],
            }
    first_add = next(a for a in actions if "add" in a)
    first_add["add"]["deletionVector"] = {
        "storageType": "i",
        "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L",
        "offset": None,
        "sizeInBytes": 36,
        "cardinality": 1,
    }
    log.write_text("".join(json.dumps(a) + "\n" for a in actions))
    for uri, version, expected in (
        (gone, None, str(victim)),
        (dv, None, "deletion vectors"),
        (delta_tables / "u", 7, "version 7"),
    ):
        start = time.monotonic()
        _, errors = run_ranks(
            2, lambda rt, u=uri, v=version: load_delta(rt, QID, tmp_path / "d", "t", str(u), v)
        )
        assert time.monotonic() - start < 30
        assert all(e is not None for e in errors) and expected in str(errors[0]), errors
        assert (
            not (tmp_path / "d" / "duckflock_catalog.json").exists()
            or "t" not in Catalog.load(tmp_path / "d").tables
        )


# ---- Iceberg ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def iceberg(tmp_path_factory) -> tuple[str, dict[str, list[int]]]:
    """A SQLite catalog: ns.p identity-partitioned on k (NULLs, a column added by the second
    snapshot), ns.b identity-partitioned on k and v (writing a bucket transform needs
    pyiceberg-core), ns.u unpartitioned. Returns the catalog URI and the
    snapshot ids of each table."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.types import DoubleType

    base = tmp_path_factory.mktemp("iceberg")
    uri = f"sqlite:///{base}/cat.db"
    cat = SqlCatalog("default", uri=uri, warehouse=f"file://{base}/wh")
    cat.create_namespace("ns")
    rows = pa.table(
        {
            "k": pa.array([i % 6 if i % 8 else None for i in range(50)], pa.int64()),
            "v": [f"s{i % 4}" for i in range(50)],
        }
    )
    snaps: dict[str, list[int]] = {}
    for name, spec in (("p", ["k"]), ("b", ["k", "v"]), ("u", [])):
        tbl = cat.create_table(f"ns.{name}", schema=rows.schema)
        for column in spec:
            with tbl.update_spec() as u:
                u.add_identity(column)
        tbl.append(rows)
        with tbl.update_schema() as u:
            u.add_column("w", DoubleType())
        tbl.append(pa.table({"k": pa.array([1, 7], pa.int64()), "v": ["x", "y"], "w": [0.5, None]}))
        snaps[name] = [s.snapshot_id for s in tbl.snapshots()]
    return uri, snaps


def test_iceberg_tables_of_a_snapshot_equal_their_scan(tmp_path, iceberg):
    from pyiceberg.catalog.sql import SqlCatalog

    uri, snaps = iceberg
    root = tmp_path / "data"
    loads = [("p", "p", None), ("p0", "p", snaps["p"][0]), ("b", "b", None), ("u", "u", None)]
    for name, ident, snap in loads:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results, errors = run_ranks(
                3, lambda rt, n=name, i=ident, s=snap: load_iceberg(rt, QID, root, n, uri, f"ns.{i}", s, 4)
            )
        assert errors == [None] * 3, errors
        assert results[0].kind == ("hash" if ident == "p" else "none")
        if ident == "b":
            assert any("identity on one column" in str(w.message) for w in caught)
    assert [c for c, _ in Catalog.load(root).table("p0").columns] == ["k", "v"]
    cat = SqlCatalog("default", uri=uri)
    ref = duckdb.connect()
    for name, ident, snap in loads:
        ref.register(f"{name}_arrow", cat.load_table(f"ns.{ident}").scan(snapshot_id=snap).to_arrow())
        ref.execute(f"CREATE VIEW {name} AS SELECT * FROM {name}_arrow")
    queries = [
        "SELECT * FROM p",
        "SELECT * FROM p0",
        "SELECT k, count(*) AS n, count(w) AS nw FROM p GROUP BY k",
        "SELECT p.k, count(*) AS n FROM p JOIN p0 ON p.k = p0.k GROUP BY p.k",
        "SELECT b.k, count(*) AS n, sum(u.w) AS sw FROM b JOIN u ON b.k = u.k GROUP BY b.k",
    ]
    compare(root, 2, queries, ref)
    assert_no_shuffle(root, 2, queries[3])


def test_iceberg_delete_files_and_missing_files_are_refused(tmp_path, iceberg, monkeypatch):
    from pyiceberg.table import DataScan

    uri, _ = iceberg
    real = DataScan.plan_files

    def with_deletes(self):
        tasks = list(real(self))
        object.__setattr__(tasks[0], "delete_files", {tasks[0].file})  # any delete file at all
        return tasks

    monkeypatch.setattr(DataScan, "plan_files", with_deletes)
    start = time.monotonic()
    _, errors = run_ranks(2, lambda rt: load_iceberg(rt, QID, tmp_path / "d", "t", uri, "ns.u"))
    assert "delete files" in str(errors[0]) and time.monotonic() - start < 30, errors
    monkeypatch.setattr(DataScan, "plan_files", real)
    from pyiceberg.catalog.sql import SqlCatalog

    path = next(iter(SqlCatalog("default", uri=uri).load_table("ns.u").scan().plan_files())).file.file_path
    local = path.removeprefix("file://")
    os.rename(local, local + ".away")
    try:
        _, errors = run_ranks(2, lambda rt: load_iceberg(rt, QID, tmp_path / "d", "t", uri, "ns.u"))
    finally:
        os.rename(local + ".away", local)
    assert all(e is not None for e in errors) and local in str(errors[0]), errors
    with pytest.raises(CatalogError, match="no snapshot 42"):
        from duckflock.ingest.iceberg import plan

        plan(uri, "default", "ns.u", 42, "t")
