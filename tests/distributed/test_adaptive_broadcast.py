"""Broadcasts are measured before they are replicated: a side the planner thinks small but that
turns out larger than the threshold is hashed on the join keys instead, and the answer stays
DuckDB's. Sides that no shuffle could replace (no equi keys) are kept and reported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import duckflock
from duckflock.exec.hosting.launch import mpiexec_path
from duckflock.exec.resources.budget import BROADCAST_SHARE, DUCKDB_PART
from duckflock.units import human
from flight_support import Workers
from support import assert_same, make_table, oracle

pytestmark = pytest.mark.dist

# Small tables read from shared storage are not broadcast at all: turn that off to get exchanges.
CONFIG = {"broadcast_threshold_bytes": 1 << 20, "shared_storage": False}

# The self-join of d on g multiplies its rows by 500, but the planner estimates a join's rows as
# its larger input's: it thinks the side is 5,000 rows (about 160 KB) and plans a broadcast.
EXPLODING = "(SELECT d1.k2, d2.g FROM d d1 JOIN d d2 ON d1.g = d2.g WHERE d2.k2 < 2000)"
FALLS_BACK = {
    "inner": f"SELECT x.g, count(*) AS n, sum(f.v) AS v FROM f JOIN {EXPLODING} x ON f.k2 = x.k2 GROUP BY 1",
    "left": f"SELECT x.g, count(*) AS n, sum(f.v) AS v FROM f LEFT JOIN {EXPLODING} x ON f.k2 = x.k2 "
    "GROUP BY 1",
    # Both broadcasts fall back, one inside the other's big side (whose two plans share it).
    "nested": "SELECT count(*) AS n, max(z.s) AS s, sum(y.g) AS g FROM (SELECT f.k2, x.g FROM f JOIN "
    "(SELECT d1.k2, d2.g FROM d d1 JOIN d d2 ON d1.g = d2.g WHERE d2.k2 < 150) x ON f.k2 = x.k2) y "
    "JOIN (SELECT d1.k2 AS zk, d1.s FROM d d1 JOIN d d2 ON d1.g = d2.g WHERE d2.k2 < 150) z ON y.k2 = z.zk",
    # A side on the driver (LIMIT finishes there) is broadcast whatever its estimate says.
    "driver side": "SELECT count(*) AS n, sum(f.v) AS v, sum(x.g) AS g FROM f JOIN "
    f"(SELECT * FROM {EXPLODING} ORDER BY k2, g LIMIT 400000) x ON f.k2 = x.k2",
}
# No shuffle replaces these broadcasts: a join without equi keys, an uncorrelated IN subquery.
KEPT = [
    f"SELECT count(*) AS n FROM f JOIN {EXPLODING} x ON f.k2 < x.k2 - 4990",
    f"SELECT count(*) AS n, sum(v) AS v FROM f WHERE k2 IN (SELECT k2 FROM {EXPLODING} x)",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("adaptive")
    make_table(
        root, "f", "SELECT i AS k, (i * 7919) % 5000 AS k2, i AS v FROM range(100000) t(i)", 4, "hash", ("k",)
    )
    make_table(root, "d", "SELECT i AS k2, 'd' || i::VARCHAR AS s, i % 10 AS g FROM range(5000) t(i)", 3)
    return root


@pytest.mark.parametrize(("transport", "ranks"), [("threads", 2), ("threads", 3), ("mpi", 2), ("mpi", 3)])
def test_misjudged_broadcast_falls_back_to_a_shuffle(data, transport, ranks):
    ref = oracle(data)
    with duckflock.connect(str(data), ranks=ranks, transport=transport, config=CONFIG) as db:
        assert "AdaptiveJoin" in db.explain(FALLS_BACK["inner"])
        for name, sql in FALLS_BACK.items():
            result = db.sql(sql, profile=True)
            assert_same(result.arrow(), ref.sql(sql).to_arrow_table())
            notes = {s.note for s in result.stats if "hashed on the join keys" in s.note}
            assert len(notes) == (2 if name == "nested" else 1), (name, notes)
        for sql in KEPT:
            result = db.sql(sql, profile=True)
            assert_same(result.arrow(), ref.sql(sql).to_arrow_table())
            assert any("no shuffle gives the same rows" in s.note for s in result.stats)


def test_small_broadcast_stays_a_broadcast(data):
    sql = "SELECT d.g, count(*) AS n FROM f JOIN d ON f.k2 = d.k2 WHERE d.s LIKE 'd1%' GROUP BY 1"
    with duckflock.connect(str(data), ranks=2, transport="threads", config=CONFIG) as db:
        result = db.sql(sql, profile=True)
        assert_same(result.arrow(), oracle(data).sql(sql).to_arrow_table())
        notes = [s.note for s in result.stats if s.note]
        assert notes and all(n.endswith(": broadcast") for n in notes), notes


@pytest.mark.parametrize("transport", ["threads", "mpi"])
def test_progress_counts_the_plan_not_taken_as_done(data, transport):
    """Stages of the adaptive plan not taken report done at once: the last snapshot is finished
    and the driver does not wait for stage reports that never come."""
    ref = oracle(data)
    with duckflock.connect(str(data), ranks=3, transport=transport, config=CONFIG) as db:
        for sql in (*FALLS_BACK.values(), "SELECT d.g, count(*) FROM f JOIN d ON f.k2 = d.k2 GROUP BY 1"):
            seen = []
            result = db.sql(sql, progress=seen.append)
            assert_same(result.arrow(), ref.sql(sql).to_arrow_table())
            # `finished` counts reports received (nothing is marked done at close): a stage the
            # driver waited for in vain would leave the last snapshot unfinished.
            assert seen and seen[-1].finished, (sql, seen[-1:])


# d and the exploding side are over this threshold but under the bound, and copies of them on every
# rank are smaller than f, which would move instead: they are broadcast, measured against the bound.
CHEAP = {"broadcast_threshold_bytes": 16 << 10, "broadcast_max_bytes": 1 << 20, "shared_storage": False}


@pytest.mark.parametrize("transport", ["threads", "mpi"])
def test_a_side_cheaper_to_copy_than_the_other_to_move_is_broadcast(data, transport):
    ref = oracle(data)
    fits = "SELECT d.g, count(*) AS n, sum(f.v) AS v FROM f JOIN d ON f.k2 = d.k2 GROUP BY 1"
    with duckflock.connect(str(data), ranks=2, transport=transport, config=CHEAP) as db:
        assert "if over 1.0MB" in db.explain(fits)
        result = db.sql(fits, profile=True)
        assert_same(result.arrow(), ref.sql(fits).to_arrow_table())
        notes = [s.note for s in result.stats if s.note]
        assert notes and all(n.endswith(": broadcast") for n in notes), notes
        # Larger than the bound once measured (not only than the threshold): hashed instead.
        result = db.sql(FALLS_BACK["inner"], profile=True)
        assert_same(result.arrow(), ref.sql(FALLS_BACK["inner"]).to_arrow_table())
        assert any("hashed on the join keys" in s.note for s in result.stats)


def test_the_broadcast_bound_fits_the_smallest_rank_under_mpi():
    """Ranks whose nodes allow them different memory (set per rank here) all plan with the bound
    of the smallest: rank 0's own, larger share would let it broadcast sides the other cannot hold.
    Their nodes' time zones differ too (also set per rank)."""
    job = [sys.executable, str(Path(__file__).with_name("mpi_bound_job.py"))]
    limit = "DUCKFLOCK_MEMORY_LIMIT_BYTES"
    argv = [mpiexec_path(), "-n", "1", "-env", limit, "1000000000", "-env", "TZ", "Asia/Tokyo", *job]
    argv += [":", "-n", "1", "-env", limit, "400000000", "-env", "TZ", "America/New_York", *job]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = sorted(line.split() for line in proc.stdout.splitlines() if line.startswith(("bound ", "zone ")))
    want = str(int(400_000_000 * DUCKDB_PART) // BROADCAST_SHARE)
    assert [s for s in said if s[0] == "bound"] == [["bound", "0", want], ["bound", "1", want]]
    # Nodes set to other time zones: every rank's DuckDB takes rank 0's, or TIMESTAMPTZ values
    # would render, truncate and hash differently from rank to rank.
    assert [s for s in said if s[0] == "zone"] == [["zone", "0", "Asia/Tokyo"], ["zone", "1", "Asia/Tokyo"]]


def test_the_broadcast_bound_fits_the_smallest_worker_over_flight(data, tmp_path):
    """The same over Flight: the caller asks every worker for its share and starts them all with the
    smallest, so worker 0 (the larger here) plans a side cheaper to copy against the other's bound."""
    limit = "DUCKFLOCK_MEMORY_LIMIT_BYTES"
    hosts = [("127.0.0.1", ["env", f"{limit}={n}"]) for n in (1_000_000_000, 400_000_000)]
    config = {k: v for k, v in CHEAP.items() if k != "broadcast_max_bytes"}
    fits = "SELECT d.g, count(*) AS n, sum(f.v) AS v FROM f JOIN d ON f.k2 = d.k2 GROUP BY 1"
    with (
        Workers(data, 2, tmp_path, hosts=hosts) as w,
        duckflock.connect(workers=w.addresses, token=w.token, config=config) as db,
    ):
        bound = int(400_000_000 * DUCKDB_PART) // BROADCAST_SHARE
        assert f"if over {human(bound, 'B')}" in db.explain(fits)
        assert_same(db.sql(fits).arrow(), oracle(data).sql(fits).to_arrow_table())
