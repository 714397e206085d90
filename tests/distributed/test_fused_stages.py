"""Stages run once for all the ranks of a process (exec/resources/fused.py) give DuckDB's answer.

A stage that reads a partitioned table and one read whole by every rank, or that only scans (and
filters) a partitioned table in a process of more ranks than cores, runs on the process's first
rank over all of its ranks' partitions; the others send no rows. Each query below puts such a stage
in front of another kind of exchange (a gather, a hash shuffle, a shuffle into range partitions),
with NULL keys, outer and anti joins, ranks that hold no partition, and empty inputs.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import duckflock
from support import BOUND_S, assert_same, make_table, one_core, oracle, read_parts, wait_until

pytestmark = pytest.mark.dist

LEAD, FOLLOW = "run once for ranks", "run by rank"
FUSE = {"fuse_min_bytes": 0}  # these tables are small: run such stages once however little is read whole

# name -> (query, whether a stage of it runs once per process)
QUERIES = {
    "gather of an aggregate": (
        "SELECT count(*) AS n, sum(b.v) AS v, max(s.s) AS s, count(b.k) AS nk FROM big b JOIN small s ON b.k = s.k",
        True,
    ),
    "hash shuffle by the small side's column": (
        "SELECT s.s, count(*) AS n, sum(b.v) AS v FROM big b JOIN small s ON b.k = s.k GROUP BY s.s",
        True,
    ),
    "left join, NULL keys kept": (
        "SELECT b.k, count(*) AS n, count(s.s) AS m FROM big b LEFT JOIN small s ON b.k = s.k "
        "WHERE b.id % 97 = 0 GROUP BY b.k",
        True,
    ),
    # The result's rows as they are: each rank's own (its part file, with output=DIR/).
    "rows returned as they are": (
        "SELECT b.id, b.k, s.s FROM big b LEFT JOIN small s ON b.k = s.k WHERE b.id % 97 = 0",
        False,
    ),
    "anti join": (
        "SELECT count(*) AS n, sum(v) AS v FROM big b WHERE NOT EXISTS (SELECT 1 FROM small s WHERE s.k = b.k)",
        True,
    ),
    "semi join, then a shuffle to count distinct": (
        "SELECT count(DISTINCT b.v % 1000) AS d FROM big b WHERE b.k IN (SELECT k FROM small WHERE k % 3 = 0)",
        True,
    ),
    "into range partitions": (
        "SELECT r.k, count(*) AS n, max(s.s) AS s FROM big b JOIN small s ON b.k = s.k "
        "JOIN r ON r.k = b.id GROUP BY r.k",
        None,  # as the planner chooses
    ),
    "top rows": (
        "SELECT b.id, s.s FROM big b JOIN small s ON b.k = s.k ORDER BY b.id DESC, s.s LIMIT 9",
        None,
    ),
    "no rows match": (
        "SELECT count(*) AS n, max(s.s) AS s, sum(b.v) AS v FROM big b JOIN small s ON b.k = s.k WHERE b.v < 0",
        True,
    ),
    "an empty table read whole": (
        "SELECT count(*) AS n, count(e.k) AS m, max(s.s) AS s FROM big b JOIN small s ON b.k = s.k "
        "LEFT JOIN empty e ON b.k = e.k",
        True,
    ),
    "a table of two partitions, on more ranks": (
        "SELECT count(*) AS n, sum(t.v) AS v, max(s.s) AS s FROM two t JOIN small s ON t.k = s.k",
        True,
    ),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fused")
    make_table(
        root,
        "big",
        "SELECT i AS id, CASE WHEN i % 11 = 0 THEN NULL ELSE i % 700 END AS k, i AS v FROM range(60000) t(i)",
        4,
        "hash",
        ("id",),
    )
    make_table(
        root,
        "small",
        "SELECT CASE WHEN i % 13 = 0 THEN NULL ELSE i % 500 END AS k, 's' || (i % 37)::VARCHAR AS s "
        "FROM range(900) t(i)",
        3,
    )
    make_table(root, "r", "SELECT i AS k, i % 5 AS w FROM range(0, 60000, 7) t(i)", 4, "range", ("k",))
    make_table(root, "empty", "SELECT i AS k FROM range(10) t(i) WHERE i < 0", 2)
    make_table(
        root, "big2", "SELECT i AS id, i % 700 AS k, i * 3 AS w FROM range(20000) t(i)", 4, "hash", ("id",)
    )
    make_table(root, "two", "SELECT i % 600 AS k, i AS v FROM range(5000) t(i)", 2)
    return root


def fused_queries(result) -> tuple[bool, bool]:
    """Whether a stage of the query ran once for all ranks, and whether other ranks said so."""
    return any(LEAD in s.note for s in result.stats), any(FOLLOW in s.note for s in result.stats)


@pytest.mark.parametrize(
    ("transport", "ranks", "per_process"), [("threads", 2, 0), ("threads", 3, 0), ("mpi", 4, 2)]
)
def test_stages_run_once_per_process_match_duckdb(data, transport, ranks, per_process):
    ref = oracle(data)
    config = {**FUSE, "ranks_per_process": per_process} if per_process else FUSE
    with duckflock.connect(str(data), ranks=ranks, transport=transport, config=config) as db:
        for name, (sql, fused) in QUERIES.items():
            result = db.sql(sql, profile=True)
            assert_same(result.arrow(), ref.sql(sql).to_arrow_table())
            if fused is not None:
                assert fused_queries(result) == (fused, fused), name
            if fused and per_process:  # each process's first rank ran it
                leads = {s.rank for s in result.stats if LEAD in s.note}
                assert leads == {0, 2}, name


# Both sides shuffled (nothing broadcast): each side's stage only scans and filters a table.
SCANS = {
    "NULL keys kept by a left join": (
        "SELECT count(*) AS n, count(c.w) AS m, sum(b.v) AS v FROM big b LEFT JOIN big2 c ON c.k = b.k "
        "WHERE b.v % 3 <> 1"
    ),
    "no row passes a filter": "SELECT count(*) AS n, max(c.w) AS w FROM big b JOIN big2 c ON c.k = b.k WHERE b.v < 0",
}


@pytest.mark.parametrize(
    ("transport", "ranks", "per_process"), [("threads", 2, 0), ("threads", 3, 0), ("mpi", 4, 2)]
)
def test_stages_that_only_scan_run_once_per_process_of_more_ranks_than_cores(
    data, transport, ranks, per_process
):
    ref = oracle(data)
    config = {**FUSE, "broadcast_threshold_bytes": 1, "broadcast_max_bytes": -1}
    if per_process:
        config["ranks_per_process"] = per_process
    # On one core every process has more ranks than cores, on any machine (the planner and the
    # processes launched see this process's cores).
    with one_core(), duckflock.connect(str(data), ranks=ranks, transport=transport, config=config) as db:
        for name, sql in SCANS.items():
            result = db.sql(sql, profile=True)
            assert_same(result.arrow(), ref.sql(sql).to_arrow_table())
            assert fused_queries(result) == (True, True), name


def test_one_rank_per_process_runs_every_stage_on_every_rank(data):
    ref = oracle(data)
    sql = QUERIES["gather of an aggregate"][0]
    with duckflock.connect(
        str(data), ranks=2, transport="mpi", config={**FUSE, "ranks_per_process": 1}
    ) as db:
        result = db.sql(sql, profile=True)
        assert_same(result.arrow(), ref.sql(sql).to_arrow_table())
        assert fused_queries(result) == (False, False)


def test_a_failing_fused_stage_ends_the_query_and_leaves_the_session_usable(data):
    """The first rank's run fails part-way: the ranks waiting for it stop with its error, and the
    next queries (fused again) give DuckDB's answer."""
    ref = oracle(data)
    failing = (
        "SELECT count(*) AS n FROM big b JOIN small s ON b.k = s.k "
        "WHERE CASE WHEN b.id = 59999 THEN error('boom in a fused stage') ELSE true END"
    )
    with duckflock.connect(str(data), ranks=3, transport="threads", config=FUSE) as db:
        for _ in range(2):
            with pytest.raises(duckflock.DuckflockError, match="boom in a fused stage"):
                db.sql(failing)
        for name in ("gather of an aggregate", "hash shuffle by the small side's column"):
            sql = QUERIES[name][0]
            result = db.sql(sql, profile=True)
            assert_same(result.arrow(), ref.sql(sql).to_arrow_table())
            assert fused_queries(result) == (True, True)


def test_little_read_whole_runs_on_every_rank(data):
    """Under ``fuse_min_bytes`` of tables read whole, a copy per rank costs less: no stage fuses."""
    ref = oracle(data)
    sql = QUERIES["gather of an aggregate"][0]
    with duckflock.connect(str(data), ranks=2, transport="threads") as db:
        result = db.sql(sql, profile=True)
        assert_same(result.arrow(), ref.sql(sql).to_arrow_table())
        assert fused_queries(result) == (False, False)


def test_part_files_are_each_ranks_and_a_fused_stage_feeds_a_stream(data, tmp_path):
    """The stage whose rows are the result as they are runs on every rank, each writing its own
    part file (run once, it would leave them all in the first rank's); a fused stage's output
    streams into the stage reading it, which starts its query alongside."""
    ref = oracle(data)
    rows = "SELECT b.id, b.k, s.s FROM big b JOIN small s ON b.k = s.k"
    config = {**FUSE, "stream_min_bytes": 0, "broadcast_threshold_bytes": 1 << 20}
    with duckflock.connect(str(data), ranks=3, transport="threads", config=config) as db:
        result = db.sql(rows, output=f"{tmp_path}/parts/", profile=True)
        assert_same(read_parts(tmp_path / "parts"), ref.sql(rows).to_arrow_table())
        parts = sorted((tmp_path / "parts").glob("part-*.parquet"))
        assert len(parts) == 3 and all(pq.read_metadata(p).num_rows for p in parts)
        assert fused_queries(result) == (False, False)
        grouped = QUERIES["hash shuffle by the small side's column"][0]
        result = db.sql(grouped, profile=True)
        assert_same(result.arrow(), ref.sql(grouped).to_arrow_table())
        assert fused_queries(result) == (True, True)
        assert any(s.streamed for s in result.stats)


# Both sides of a join read a table whole, each in a stage run once per process; the join's stage
# streams the left one, so all three run at once (plan/streaming.py).
TWO_FUSED = (
    "SELECT x.s, count(*) AS n, sum(y.w) AS w FROM (SELECT b.k AS k, b.v, s.s FROM big b JOIN small s ON b.k = s.k) x "
    "JOIN (SELECT c.k AS k, c.w FROM big2 c JOIN small s2 ON c.k = s2.k WHERE s2.s <> 's3') y ON x.k = y.k GROUP BY x.s"
)
STREAMING = {**FUSE, "stream_min_bytes": 0, "broadcast_threshold_bytes": 65536}


@pytest.mark.parametrize("threads", [0, len(os.sched_getaffinity(0))])
def test_fused_stages_running_at_once_each_have_a_connection(data, threads):
    """Two fused stages at once (and, with as many DuckDB threads per rank as cores, no second
    DuckDB: the first rank's own runs the group's other stage too) each get a cursor; the memory
    limit raised for them is back to a rank's once they end, and nothing of them is kept."""
    ref = oracle(data)
    config = {**STREAMING, "threads": threads}
    with duckflock.connect(str(data), ranks=2, transport="threads", config=config) as db:
        first = db._backend.ranks_here.runtimes[0]
        for _ in range(3):
            result = db.sql(TWO_FUSED, profile=True)
            assert_same(result.arrow(), ref.sql(TWO_FUSED).to_arrow_table())
            assert len({s.sid for s in result.stats if LEAD in s.note}) == 2
            assert any(s.streamed for s in result.stats)
        limit = "SELECT current_setting('memory_limit')"
        cons = [first.con, *([first.driver_con] if first.driver_con is not None else [])]
        assert {c.execute(limit).fetchall()[0] for c in cons} == {first.con.execute(limit).fetchall()[0]}
        assert len(first._driver_con) <= 1
        with pytest.raises(duckflock.DuckflockError, match="boom"):
            db.sql(
                TWO_FUSED.replace(
                    "WHERE s2.s <> 's3'", "WHERE CASE WHEN c.id = 19999 THEN error('boom') ELSE true END"
                )
            )
        assert first.process is not None and not first.process._runs


def test_fused_stages_running_at_once_in_two_processes(data):
    ref = oracle(data)
    config = {**STREAMING, "ranks_per_process": 2}
    with duckflock.connect(str(data), ranks=4, transport="mpi", config=config) as db:
        for _ in range(2):
            result = db.sql(TWO_FUSED, profile=True)
            assert_same(result.arrow(), ref.sql(TWO_FUSED).to_arrow_table())
            assert {s.rank for s in result.stats if LEAD in s.note} == {0, 2}


def test_ctrl_c_in_a_fused_stage_stops_the_ranks_waiting_for_it(data, monkeypatch):
    """A fault injected at an observed point: once rank 1 waits for rank 0's fused run, Ctrl-C
    reaches the caller's thread while rank 0 is inside it; once the cancel has reached rank 0, its
    DuckDB query starts (and is interrupted). The query raises KeyboardInterrupt at once, the
    waiting rank is told, and the next query (fused again) gives DuckDB's answer."""
    from duckflock.exec.resources import fused
    from duckflock.exec.stages import output

    waiting = threading.Event()
    real_wait, real_send = fused.ProcessRanks.wait, output.send

    def observed_wait(self, *args):
        waiting.set()
        return real_wait(self, *args)

    def interrupted_send(run, *args):
        if run.fused and not interrupted_send.done:
            interrupted_send.done = True
            assert waiting.wait(BOUND_S)
            os.kill(os.getpid(), signal.SIGINT)  # to the main thread, which waits for this one
            wait_until(lambda: run.rt.mux.failure(run.qid) is not None, "the cancel never came")
        return real_send(run, *args)

    interrupted_send.done = False
    monkeypatch.setattr(fused.ProcessRanks, "wait", observed_wait)
    monkeypatch.setattr(output, "send", interrupted_send)
    sql = QUERIES["gather of an aggregate"][0]
    with duckflock.connect(str(data), ranks=2, transport="threads", config=FUSE) as db:
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            db.sql(sql)
        assert time.monotonic() - t0 < BOUND_S
        result = db.sql(sql, profile=True)
        assert_same(result.arrow(), oracle(data).sql(sql).to_arrow_table())
        assert fused_queries(result) == (True, True)
        assert not db._backend.ranks_here.runtimes[0].process._runs
