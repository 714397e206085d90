"""``duckflock vacuum``: a load to objects killed with SIGKILL after its first object appeared
leaves objects no table names; vacuum lists them (``dry_run``), then removes them and the load's
lease and staging directory, never an object a table names nor anything a running load writes; the
table kept there still answers as DuckDB does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from test_ingest_load import QID, run_ranks

import duckflock
from duckflock.catalog import Catalog
from duckflock.ingest import leases
from duckflock.ingest.load import STAGING_PREFIX, load_table
from duckflock.storage import objects
from s3_support import bucket
from support import assert_same

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BUCKET = "vacuum"  # its own: other tests leave tables under lake/tables/
OUT = f"s3://{BUCKET}/tables/"
WAIT_S = 120  # for the killed load to show its lease and first object


@pytest.fixture(scope="module")
def s3():
    with bucket(BUCKET) as c:
        yield c


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("in") / "rows.parquet"
    duckdb.sql(
        f"COPY (SELECT i AS k, i * 7 % 1000 AS v, repeat('x', 40) AS pad FROM range(400000) t(i)) TO '{path}'"
    )
    return path


def keys(s3) -> set[str]:
    found = s3.list_objects_v2(Bucket=BUCKET, Prefix="tables/").get("Contents", [])
    return {f"s3://{BUCKET}/{o['Key']}" for o in found if not o["Key"].endswith("/")}


def until(what: str, check):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.005)
    raise AssertionError(f"no {what} within {WAIT_S} s")


def killed_load(root: Path, table: str, rows: Path, s3) -> bool:
    """Start a load of ``table`` to OUT on 2 rank processes; SIGKILL its rank 0 once the load's
    first object exists. Whether it was killed before it saved its catalog entry."""
    argv = ["load", "--data", str(root), "--table", table, "--partition-by", "k", "--partitions", "16"]
    cmd = [sys.executable, "-m", "duckflock.cli.main", *argv, "--ranks", "2", "--output", OUT, str(rows)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:

        def lease() -> leases.Lease | None:
            found = [lease for _, lease in leases.records(root) if lease is not None and lease.table == table]
            return found[0] if found else None

        mine = until("lease", lease)
        until("object of the load", lambda: any(f"-{mine.tag}.parquet" in k for k in keys(s3)))
        os.kill(mine.pid, signal.SIGKILL)  # rank 0: it saves the catalog entry
        proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Catalog.load(root).find(table) is None


def test_vacuum_removes_what_a_killed_load_left(s3, rows, tmp_path):
    root = tmp_path / "data"
    _, errors = run_ranks(
        2, lambda rt: load_table(rt, QID, root, "kept", [str(rows)], ["k"], 4, None, None, output=OUT)
    )
    assert errors == [None, None], errors
    named = set(Catalog.load(root).table("kept").object_uris())
    assert keys(s3) == named

    for attempt in range(3):  # a load that saved its entry before the kill landed: again
        if killed_load(root, f"doomed{attempt}", rows, s3):
            break
    else:
        pytest.fail("every load finished before it could be killed")
    left = keys(s3) - named
    assert any(k.rsplit("/", 1)[1].startswith(leases.OBJECT_PREFIX) for k in left)  # its lease
    assert any(k.endswith(".parquet") for k in left)
    assert leases.records(root)

    found = duckflock.vacuum(root, older_than=0, dry_run=True)
    assert set(found.objects) == left and keys(s3) == named | left  # listed, nothing removed
    assert all(p.exists() for p in found.paths) and found.paths
    young = duckflock.vacuum(root, older_than=3600, dry_run=True)  # too recent to be sure
    assert not young.objects and not young.paths

    cli = [sys.executable, "-m", "duckflock.cli.main", "vacuum", "--data", str(root), "--older-than", "0"]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    assert f"removed {len(left)} objects" in done.stdout
    assert keys(s3) == named and not leases.records(root)
    assert not list(root.glob(f"*/{STAGING_PREFIX}*"))  # staging directories
    assert not duckflock.vacuum(root, older_than=0).lines()

    with duckflock.connect(str(root), ranks=2, transport="threads") as db:
        q = "SELECT v, count(*) AS n, sum(k) AS s, max(pad) AS p FROM {} GROUP BY v"
        expected = duckdb.sql(q.format(f"'{rows}'")).to_arrow_table()
        assert_same(db.sql(q.format("kept")).arrow(), expected)


def test_vacuum_leaves_a_running_loads_prefix_alone(s3, tmp_path):
    root = tmp_path / "data"
    prefix = f"s3://{BUCKET}/tables/running/"
    lease = leases.Lease.mine("0123456789abcdef", "t", prefix)  # this process: running
    leases.take(root, lease)
    leases.put_object(lease)
    orphan = f"{prefix}part-0-r0-{lease.tag}.parquet"
    objects.put_bytes(orphan, b"x")
    found = duckflock.vacuum(root, older_than=0)
    assert not found.objects and any(prefix in s for s in found.skipped)
    assert orphan in keys(s3) and leases.records(root)
    # The process gone (a lease of a pid that has ended): all of it goes.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead = leases.Lease(**{**json.loads(lease.to_json()), "pid": int(gone.stdout)})
    leases.take(root, dead)
    leases.put_object(dead)
    found = duckflock.vacuum(root, older_than=0)
    assert set(found.objects) == {orphan, dead.object_uri()}
    assert not {orphan, dead.object_uri()} & keys(s3) and not leases.records(root)


def test_vacuum_removes_exchange_jobs_no_heartbeat_renews(tpch_dir, tmp_path):
    """A storage-exchange job renews its heartbeat while it runs: vacuum leaves it; a job left
    as a killed launcher leaves it (the same objects, none renewed for a while) goes."""
    import shutil

    exchange = tmp_path / "exchange"
    config = {"exchange_uri": str(exchange)}
    with duckflock.connect(str(tpch_dir), ranks=2, transport="storage", config=config) as db:
        assert db.sql("SELECT count(*) FROM nation").fetchall() == [(25,)]
        (live,) = [d for d in exchange.iterdir() if (d / "hb").is_dir()]
        left = exchange / "left-by-a-killed-launcher"
        shutil.copytree(live, left)
        hour_ago = time.time() - 3600
        for f in [left, *left.rglob("*")]:
            os.utime(f, (hour_ago, hour_ago))
        found = duckflock.vacuum(tmp_path / "data", older_than=60, exchanges=[str(exchange)])
        assert found.jobs == [f"{exchange}/{left.name}"]
        assert not left.exists() and live.is_dir()
        assert db.sql("SELECT count(*) FROM region").fetchall() == [(5,)]  # the session goes on
