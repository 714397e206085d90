"""Lake tables read at one version per query (ingest/versions.py, sql/time_travel.py): a table
registered without a version follows its commits, one registered at a version stays there, and
``VERSION AS OF`` / ``AT (VERSION => n)`` / ``TIMESTAMP AS OF`` read another. Every answer equals
single-process DuckDB over the files of that version, as deltalake and pyiceberg read them."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from test_ingest_load import QID, load, run_ranks
from test_lake_tables import write

import duckflock
import duckflock.errors
from duckflock.errors import CatalogError
from duckflock.ingest.delta import load_delta
from duckflock.ingest.iceberg import load_iceberg
from support import assert_same

pytestmark = pytest.mark.timeout(120)


def rows(start: int, n: int, keys: list[int]) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([keys[i % len(keys)] for i in range(n)], pa.int64()),
            "v": pa.array(range(start, start + n), pa.int64()),
        }
    )


def check(db: duckflock.Session, query: str, tables: dict[str, pa.Table], ref: str | None = None) -> None:
    """``query`` on duckflock equals DuckDB's ``ref`` (default the same query) over ``tables``."""
    con = duckdb.connect()
    for name, table in tables.items():
        con.register(name, table)
    assert_same(db.sql(query).arrow(), con.sql(ref or query).to_arrow_table())


def test_delta_table_follows_its_commits_and_travels_back(tmp_path):
    from deltalake import DeltaTable, write_deltalake

    uri, root = str(tmp_path / "d"), tmp_path / "data"
    write_deltalake(uri, rows(0, 30, [1, 2, 3]), partition_by=["k"])
    for name, version in (("p", None), ("p0", 0)):
        _, errors = run_ranks(2, lambda rt, n=name, v=version: load_delta(rt, QID, root, n, uri, v, 4))
        assert errors == [None, None], errors

    def at(version: int | None = None) -> pa.Table:
        return DeltaTable(uri, version=version).to_pyarrow_table()

    query = "SELECT k, count(*) AS n, sum(v) AS s FROM p GROUP BY k"
    with duckflock.connect(str(root), ranks=2, transport="threads") as db:
        check(db, query, {"p": at()})
        write_deltalake(uri, rows(100, 7, [1, 4]), mode="append", partition_by=["k"])  # version 1
        check(db, query, {"p": at()})
        assert "p: Delta version 1" in db.explain(query)
        join = "SELECT p.k, count(*) AS n FROM p JOIN p0 ON p.k = p0.k GROUP BY p.k"
        assert "co-located" in db.explain(join)  # the new files placed by their key's hash
        check(db, join, {"p": at(), "p0": at(0)})
        check(db, "SELECT * FROM p0", {"p0": at(0)})  # registered at version 0: stays there
        check(db, "SELECT * FROM p VERSION AS OF 0", {"p0": at(0)}, "SELECT * FROM p0")
        check(db, "SELECT * FROM p AT (VERSION => 0)", {"p0": at(0)}, "SELECT * FROM p0")
        both = "SELECT a.k, count(*) AS n FROM {} AS a JOIN p AS b ON a.k = b.k GROUP BY a.k"
        check(db, both.format("p VERSION AS OF 0"), {"p": at(), "p0": at(0)}, both.format("p0"))
        write_deltalake(uri, rows(500, 12, [2, 5, 6]), mode="overwrite", partition_by=["k"])  # version 2
        check(db, query, {"p": at()})
        check(db, "SELECT * FROM p VERSION AS OF 1", {"p1": at(1)}, "SELECT * FROM p1")
        later = "SELECT count(*) AS n FROM p TIMESTAMP AS OF '2999-01-01'"
        assert db.sql(later).fetchall() == [(12,)]
        start = time.monotonic()
        for bad, expected in (
            ("SELECT * FROM p VERSION AS OF 42", "table 'p' VERSION AS OF 42"),
            ("SELECT * FROM p TIMESTAMP AS OF '1999-01-01'", "no version at or before 1999-01-01"),
        ):
            with pytest.raises(CatalogError, match=expected):
                db.sql(bad)
        assert time.monotonic() - start < 30
        check(db, query, {"p": at()})  # the session goes on
        gone = DeltaTable(uri).file_uris()[0].removeprefix("file://")
        Path(gone).unlink()  # as a vacuum would
        with pytest.raises(duckflock.errors.DuckflockError) as failed:
            db.sql(query)
        assert gone in str(failed.value) and "table 'p' at Delta version 2" in str(failed.value)


def test_versions_of_a_plain_table_are_refused(tmp_path):
    write(duckdb.connect(), tmp_path / "f.parquet", "SELECT 1 AS x")
    load(1, tmp_path / "data", "f", [str(tmp_path / "f.parquet")])
    with (
        duckflock.connect(str(tmp_path / "data"), ranks=2, transport="threads") as db,
        pytest.raises(CatalogError, match="'f' is not a Delta or Iceberg table"),
    ):
        db.sql("SELECT * FROM f VERSION AS OF 1")


def test_iceberg_table_follows_its_snapshots_and_travels_back(tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    uri, root = f"sqlite:///{tmp_path}/cat.db", tmp_path / "data"
    cat = SqlCatalog("default", uri=uri, warehouse=f"file://{tmp_path}/wh")
    cat.create_namespace("ns")
    first = rows(0, 20, [1, 2, 3])
    tbl = cat.create_table("ns.p", schema=first.schema)
    with tbl.update_spec() as u:
        u.add_identity("k")
    tbl.append(first)
    _, errors = run_ranks(2, lambda rt: load_iceberg(rt, QID, root, "p", uri, "ns.p", None, 4))
    assert errors == [None, None], errors
    old = tbl.current_snapshot().snapshot_id
    query = "SELECT k, count(*) AS n, sum(v) AS s FROM p GROUP BY k"
    with duckflock.connect(str(root), ranks=2, transport="threads") as db:
        check(db, query, {"p": tbl.scan().to_arrow()})
        tbl.append(rows(100, 9, [3, 7]))
        new = tbl.current_snapshot().snapshot_id
        check(db, query, {"p": tbl.scan().to_arrow()})
        assert f"p: Iceberg snapshot {new}" in db.explain(query)
        old_rows = {"p0": tbl.scan(snapshot_id=old).to_arrow()}
        check(db, f"SELECT * FROM p VERSION AS OF {old}", old_rows, "SELECT * FROM p0")
        with pytest.raises(CatalogError, match=r"table 'p' VERSION AS OF 42: .*no snapshot 42"):
            db.sql("SELECT * FROM p VERSION AS OF 42")


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("SELECT * FROM t VERSION AS OF 3", 'SELECT * FROM "t@3" AS t'),
        ("SELECT * FROM t FOR VERSION AS OF 3 AS a", 'SELECT * FROM "t@3" AS a'),
        ('SELECT * FROM "t" a AT (VERSION => 3) WHERE a.x > 1', 'SELECT * FROM "t@3" a WHERE a.x > 1'),
        (
            "SELECT 1 FROM t TIMESTAMP AS OF '2024-01-01' JOIN u USING (k)",
            'SELECT 1 FROM "t@3" AS t JOIN u USING (k)',
        ),
    ],
)
def test_time_travel_clauses_become_tables_of_their_own(query, expected):
    from duckflock.sql.time_travel import references, rewrite

    refs = references(query)
    assert refs is not None and len(refs.as_of) == 1
    assert rewrite(query, refs.as_of, ["t@3"]) == expected


def test_versions_given_from_python_and_the_cli(tmp_path):
    """``sql(q, versions=...)`` and ``--at t=N`` read that version as VERSION AS OF does; plans
    and errors name it ``t VERSION AS OF N``, not the plan's own name of it."""
    from deltalake import DeltaTable, write_deltalake

    uri, root = str(tmp_path / "d"), tmp_path / "data"
    write_deltalake(uri, rows(0, 30, [1, 2, 3]), partition_by=["k"])
    _, errors = run_ranks(2, lambda rt: load_delta(rt, QID, root, "p", uri, None, 4))
    assert errors == [None, None], errors
    write_deltalake(uri, rows(100, 7, [1, 4]), mode="append", partition_by=["k"])  # version 1
    v0 = {"p": DeltaTable(uri, version=0).to_pyarrow_table()}
    query = "SELECT k, count(*) AS n, max(v) AS s FROM p WHERE v IN (SELECT v FROM p) GROUP BY k"
    with duckflock.connect(str(root), ranks=2, transport="threads") as db:
        con = duckdb.connect()
        con.register("p", v0["p"])
        want = con.sql(query).to_arrow_table()
        assert_same(db.sql(query, versions={"p": 0}).arrow(), want)
        assert_same(db.sql(query, versions={"P": "2999-01-01"}).arrow(), db.sql(query).arrow())
        shown = db.explain(query, versions={"p": 0})
        assert "p VERSION AS OF 0: Delta version 0" in shown and "Scan p VERSION AS OF 0" in shown
        assert "@" not in shown
        with pytest.raises(duckflock.errors.SqlError, match="versions given for 'q'"):
            db.sql(query, versions={"q": 1})
        with pytest.raises(CatalogError, match="table 'p' VERSION AS OF 42"):
            db.sql(query, versions={"p": 42})
    out = tmp_path / "out.parquet"
    argv = ["sql", "--data", str(root), "--ranks", "2", "--at", "p=0", "--output", str(out), query]
    done = subprocess.run(
        [sys.executable, "-m", "duckflock.cli.main", *argv], capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()
    assert_same(pa.parquet.read_table(out), want)


@pytest.mark.parametrize(
    ("query", "versions", "expected"),
    [
        (
            "SELECT * FROM T a JOIN u USING (k)",
            {"t": 3},
            "SELECT * FROM T VERSION AS OF 3 a JOIN u USING (k)",
        ),
        (
            "WITH t AS (SELECT 1) SELECT * FROM t, p",
            {"p": "2024-01-01"},
            "WITH t AS (SELECT 1) SELECT * FROM t, p TIMESTAMP AS OF '2024-01-01'",
        ),
        (
            "SELECT * FROM t VERSION AS OF 1, t b",
            {"t": 3},
            "SELECT * FROM t VERSION AS OF 1, t VERSION AS OF 3 b",
        ),
    ],
)
def test_versions_pin_each_reference(query, versions, expected):
    from duckflock.sql.time_travel import pin

    assert pin(query, versions) == expected
