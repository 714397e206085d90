"""Iceberg tables behind a real REST catalog (Apache Iceberg's own server, tests/iceberg_rest_support.py),
written through pyiceberg's REST client and registered by the catalog's http URI. Every answer equals
single-process DuckDB over pyiceberg's scan of the same snapshot."""

from __future__ import annotations

import socket
import time

import pyarrow as pa
import pytest
from test_ingest_load import QID, run_ranks
from test_lake_tables import assert_no_shuffle
from test_lake_versions import check

import duckflock
from duckflock.catalog import Catalog
from duckflock.errors import CatalogError
from duckflock.ingest.iceberg import load_iceberg
from iceberg_rest_support import rest_catalog

# The first test of a fresh clone fetches the server's jars (tens of MB) from Maven Central.
pytestmark = pytest.mark.timeout(900)


def rows(start: int, n: int) -> pa.Table:
    keys = [i % 5 if i % 7 else None for i in range(start, start + n)]  # NULL partition values
    return pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array(range(start, start + n), pa.int64())})


@pytest.fixture(scope="module")
def rest(tmp_path_factory):
    """The server with ns.p (identity-partitioned on k) and ns.u (unpartitioned), each in two
    snapshots: 40 rows, then a column w added and 12 rows appended. Yields the catalog's URI."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.types import DoubleType

    with rest_catalog(tmp_path_factory.mktemp("iceberg-rest")) as uri:
        cat = load_catalog("rest", type="rest", uri=uri)
        cat.create_namespace("ns")
        for name in ("p", "u"):
            tbl = cat.create_table(f"ns.{name}", schema=rows(0, 1).schema)
            if name == "p":
                with tbl.update_spec() as spec:
                    spec.add_identity("k")
            tbl.append(rows(0, 40))
            with tbl.update_schema() as schema:
                schema.add_column("w", DoubleType())
            more = rows(100, 12)
            tbl.append(more.append_column("w", pa.array([i / 2 if i % 3 else None for i in range(12)])))
        yield uri


def scan(uri: str, identifier: str, snapshot: int | None = None) -> pa.Table:
    from pyiceberg.catalog import load_catalog

    return (
        load_catalog("rest", type="rest", uri=uri)
        .load_table(identifier)
        .scan(snapshot_id=snapshot)
        .to_arrow()
    )


def snapshots(uri: str, identifier: str) -> list[int]:
    from pyiceberg.catalog import load_catalog

    tbl = load_catalog("rest", type="rest", uri=uri).load_table(identifier)
    return [s.snapshot_id for s in tbl.snapshots()]


def test_rest_catalog_tables_equal_their_scan(tmp_path, rest):
    root = tmp_path / "data"
    first = snapshots(rest, "ns.p")[0]
    loads = [("p", "ns.p", None), ("p0", "ns.p", first), ("u", "ns.u", None)]
    for name, ident, snap in loads:
        results, errors = run_ranks(
            2, lambda rt, n=name, i=ident, s=snap: load_iceberg(rt, QID, root, n, rest, i, s, 4)
        )
        assert errors == [None, None], errors
        assert results[0].kind == ("hash" if ident == "ns.p" else "none")
        assert results[0].source["catalog"] == rest
    assert [c for c, _ in Catalog.load(root).table("p0").columns] == ["k", "v"]  # as of its snapshot
    tables = {"p": scan(rest, "ns.p"), "p0": scan(rest, "ns.p", first), "u": scan(rest, "ns.u")}
    join = "SELECT p.k, count(*) AS n, sum(p0.v) AS s FROM p JOIN p0 ON p.k = p0.k GROUP BY p.k"
    with duckflock.connect(str(root), ranks=2, transport="threads") as db:
        for query in (
            "SELECT * FROM p",
            "SELECT * FROM p0",
            "SELECT k, count(*) AS n, count(w) AS nw, sum(v) AS s FROM p GROUP BY k",
            join,
            "SELECT u.k, count(*) AS n, sum(p.w) AS sw FROM u JOIN p ON u.v = p.v GROUP BY u.k",
        ):
            check(db, query, tables)
        # Time travel, the catalog asked again at query time.
        check(db, f"SELECT * FROM p VERSION AS OF {first}", tables, "SELECT * FROM p0")
        u0 = snapshots(rest, "ns.u")[0]
        check(db, f"SELECT * FROM u VERSION AS OF {u0}", {"u0": scan(rest, "ns.u", u0)}, "SELECT * FROM u0")
    assert_no_shuffle(root, 2, join)


def test_rest_table_followed_sees_a_new_snapshot(tmp_path, rest):
    from pyiceberg.catalog import load_catalog

    root = tmp_path / "data"
    tbl = load_catalog("rest", type="rest", uri=rest).create_table("ns.f", schema=rows(0, 1).schema)
    tbl.append(rows(0, 20))
    _, errors = run_ranks(2, lambda rt: load_iceberg(rt, QID, root, "f", rest, "ns.f", None, 4))
    assert errors == [None, None], errors
    query = "SELECT k, count(*) AS n, sum(v) AS s FROM f GROUP BY k"
    with duckflock.connect(str(root), ranks=2, transport="threads") as db:
        check(db, query, {"f": scan(rest, "ns.f")})
        tbl.append(rows(50, 9))
        check(db, query, {"f": scan(rest, "ns.f")})
        assert f"f: Iceberg snapshot {snapshots(rest, 'ns.f')[-1]}" in db.explain(query)


def test_rest_catalog_errors_name_the_catalog_and_are_quick(tmp_path, rest, monkeypatch):
    def fails(uri: str, identifier: str, expected: str) -> None:
        start = time.monotonic()
        _, errors = run_ranks(2, lambda rt: load_iceberg(rt, QID, tmp_path / "d", "t", uri, identifier))
        assert time.monotonic() - start < 30
        assert isinstance(errors[0], CatalogError) and errors[1] is not None, errors
        message = str(errors[0])
        assert f"Iceberg table {identifier} of {uri}" in message and expected in message, message

    fails(rest, "ns.nope", "does not exist")
    fails(rest, "nope.p", "does not exist")
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    fails(f"http://127.0.0.1:{port}", "ns.p", "Connection refused")
    monkeypatch.setenv("DUCKFLOCK_ICEBERG_TIMEOUT_S", "2")
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        fails(f"http://127.0.0.1:{silent.getsockname()[1]}", "ns.p", "timed out")
    assert not (tmp_path / "d" / "duckflock_catalog.json").exists()
