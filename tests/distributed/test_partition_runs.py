"""Stages run once per group of a rank's partitions (exec/stages/partition_runs.py) give DuckDB's answer.

Every eligible stage is split as finely as it can be (a one-byte allowance per run), so each query
below runs its joins, aggregates, windows and set operations once per partition a rank holds; NULL
keys, keys outside every range partition and outer joins check that each row is in exactly one run.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import duckflock
from duckflock.exec.stages import output, partition_runs
from support import assert_same, make_table, oracle

pytestmark = pytest.mark.dist

SPLIT = {"partition_run_bytes": 1, "stream_inputs": False, "broadcast_threshold_bytes": 0}
NOTE = "ran once per group of partitions"

# name -> (query, whether a stage of it must run in groups). f, dealt round-robin, moves into the
# partitioning of a, b (hash) or r (range): the stage reading it also reads those tables' files.
QUERIES = {
    "join into hash partitions": (
        "SELECT a.g, count(*) AS n, sum(length(f.s)) AS l FROM a JOIN f ON a.k = f.x GROUP BY a.g",
        True,
    ),
    "left join, NULL keys": ("SELECT f.x, f.s, a.g FROM f LEFT JOIN a ON f.x = a.k", True),
    "full join": ("SELECT a.k, f.x, a.s, f.s AS fs FROM a FULL JOIN f ON a.k = f.x", True),
    "anti join": ("SELECT x, s FROM f WHERE NOT EXISTS (SELECT 1 FROM a WHERE a.k = f.x)", True),
    "semi join": (
        "SELECT k, s FROM a WHERE EXISTS (SELECT 1 FROM f WHERE f.x = a.k AND length(f.s) > 4)",
        True,
    ),
    "three tables": (
        "SELECT a.g, count(*) AS n, sum(b.v) AS v FROM a JOIN b ON a.k = b.k JOIN f ON f.x = a.k GROUP BY a.g",
        True,
    ),
    "group by key": (
        "SELECT f.x, count(*) AS n, min(b.s) AS s FROM f JOIN b ON f.x = b.k GROUP BY f.x HAVING count(*) > 1",
        True,
    ),
    "window by key": (
        "SELECT a.k, f.s, row_number() OVER (PARTITION BY a.k ORDER BY f.s, a.s) AS rn FROM a JOIN f ON a.k = f.x",
        True,
    ),
    "distinct": ("SELECT DISTINCT a.g, f.x FROM a JOIN f ON a.k = f.x", True),
    "top rows of a join": ("SELECT a.k, f.s FROM a JOIN f ON a.k = f.x ORDER BY f.s DESC, a.k LIMIT 7", True),
    # Keys below, between and above r's ranges, and NULL, must each come out once.
    "range, shuffled side preserved": ("SELECT f.x, f.s, r.w FROM f LEFT JOIN r ON f.x = r.k", True),
    "range, aggregate": (
        "SELECT r.k % 5 AS m, count(*) AS n, max(f.s) AS s FROM r JOIN f ON r.k = f.x GROUP BY 1",
        True,
    ),
    # Tables only: no received rows to measure, the stage runs once.
    "co-located tables": (
        "SELECT a.g, count(*) AS n, sum(b.v) AS v FROM a JOIN b ON a.k = b.k GROUP BY a.g",
        False,
    ),
    # Both sides hashed afresh into one partition per rank: nothing to split.
    "intersect": ("SELECT k FROM a INTERSECT SELECT k FROM b", False),
    "except all": ("SELECT k FROM a EXCEPT ALL SELECT k FROM b", False),
    # Hot keys are spread over the ranks, not kept by partition: that stage runs once.
    "skewed join": ("SELECT count(*) AS n, sum(b.v) AS v FROM h JOIN b ON h.hot = b.k", False),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("partition_runs")
    # a and b: hashed on k into 6 partitions (3 or 2 per rank), co-located; NULL keys on both sides.
    make_table(
        root,
        "a",
        "SELECT CASE WHEN i % 17 = 0 THEN NULL ELSE i % 400 END AS k, i % 9 AS g, 's' || i::VARCHAR AS s "
        "FROM range(3000) t(i)",
        6,
        "hash",
        ("k",),
    )
    make_table(
        root,
        "b",
        "SELECT CASE WHEN i % 23 = 0 THEN NULL ELSE (i * 7) % 500 END AS k, i AS v, 'b' || (i % 31)::VARCHAR AS s "
        "FROM range(2500) t(i)",
        6,
        "hash",
        ("k",),
    )
    # r: range-partitioned on k with gaps between its ranges; f: dealt round-robin.
    make_table(
        root, "r", "SELECT i * 10 AS k, i AS w FROM range(1, 300) t(i) WHERE i % 50 < 40", 6, "range", ("k",)
    )
    make_table(
        root,
        "f",
        "SELECT CASE WHEN i % 29 = 0 THEN NULL ELSE i % 3200 - 100 END AS x, 'f' || i::VARCHAR AS s "
        "FROM range(5000) t(i)",
        4,
    )
    # h: one key holds half the rows (a hot key of a large side).
    make_table(
        root,
        "h",
        "SELECT CASE WHEN i % 2 = 0 THEN 7 ELSE i % 500 END AS hot FROM range(240000) t(i)",
        4,
    )
    return root


@pytest.mark.parametrize(("transport", "ranks"), [("threads", 2), ("threads", 3), ("mpi", 2)])
def test_stages_split_by_partition_match_duckdb(data, transport, ranks):
    ref = oracle(data)
    split = set()
    with duckflock.connect(str(data), ranks=ranks, transport=transport, config=SPLIT) as db:
        for name, (sql, _) in QUERIES.items():
            result = db.sql(sql, profile=True)
            assert_same(result.arrow(), ref.sql(sql).to_arrow_table())
            if any(NOTE in s.note for s in result.stats):
                split.add(name)
    assert split == {name for name, (_, splits) in QUERIES.items() if splits}


def test_split_off_runs_each_stage_once(data):
    ref = oracle(data)
    sql = QUERIES["join into hash partitions"][0]
    with duckflock.connect(
        str(data), ranks=2, transport="threads", config={**SPLIT, "partition_run_bytes": -1}
    ) as db:
        result = db.sql(sql, profile=True)
        assert_same(result.arrow(), ref.sql(sql).to_arrow_table())
        assert not any(NOTE in s.note for s in result.stats)


def test_failed_split_stage_leaves_the_session_usable(data):
    """A run that fails part-way leaves no view behind: later queries read their exchanges under
    the same names, split or not."""
    ref = oracle(data)
    failing = (
        "SELECT count(*) AS n FROM a JOIN f ON a.k = f.x "
        "WHERE CASE WHEN a.k = 399 AND f.x = 399 THEN error('boom') ELSE true END"
    )
    with duckflock.connect(str(data), ranks=2, transport="threads", config=SPLIT) as db:
        result = db.sql(QUERIES["join into hash partitions"][0], profile=True)
        assert any(NOTE in s.note for s in result.stats)
        with pytest.raises(duckflock.DuckflockError, match="boom"):
            db.sql(failing)
        for name in ("intersect", "join into hash partitions", "range, aggregate"):
            sql = QUERIES[name][0]
            assert_same(db.sql(sql).arrow(), ref.sql(sql).to_arrow_table())


def test_run_failing_with_its_result_open_leaves_the_session_usable(data, monkeypatch):
    """A fault injected at an observed point: rank 0's writer fails in the second run, after DuckDB
    has given that run's first batch and before it has given the rest (its result is open). The
    query reports it, and later queries find no view of the failed run left behind."""
    runs: dict[int, int] = {}  # runs begun, by the thread of the rank running them

    def read_group(self, con, group):
        runs[threading.get_ident()] = runs.get(threading.get_ident(), 0) + 1
        return real_read_group(self, con, group)

    def write(run, writer, out, reader, t0):
        if run.rt.rank == 0 and runs.get(threading.get_ident()) == 2:
            reader.read_next_batch()
            raise duckflock.DuckflockError("injected: the writer failed mid-run")
        return real_write(run, writer, out, reader, t0)

    real_read_group, real_write = partition_runs.PartitionGroups.read_group, output._write
    monkeypatch.setattr(partition_runs.PartitionGroups, "read_group", read_group)
    monkeypatch.setattr(output, "_write", write)
    ref = oracle(data)
    sql = QUERIES["join into hash partitions"][0]
    # Batches of a few rows: the failing run's result holds more than the batch taken.
    with duckflock.connect(str(data), ranks=2, transport="threads", config={**SPLIT, "batch_rows": 8}) as db:
        with pytest.raises(duckflock.DuckflockError, match="injected"):
            db.sql(sql)
        assert runs, "no stage ran in groups"
        monkeypatch.setattr(output, "_write", real_write)
        for name in ("join into hash partitions", "range, aggregate"):
            sql = QUERIES[name][0]
            assert_same(db.sql(sql).arrow(), ref.sql(sql).to_arrow_table())
