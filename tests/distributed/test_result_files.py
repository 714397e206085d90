"""Results written to files as they are produced: with ``output=DIR/`` every rank writes its own
Parquet part (no gather), in name order for a range-partitioned ORDER BY; with a file the driver
streams the batches into it. Read back, both equal DuckDB's answer."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import duckflock
from support import BOUND_S, assert_same, make_table, one_core, oracle, read_parts

pytestmark = pytest.mark.dist

# Every ORDER BY sorts in parallel (range-partitioned); small tables are exchanged, not read whole.
CONFIG = {"range_sort_threshold_bytes": 0, "shared_storage": False}

QUERIES = {  # name -> (SQL, ORDER BY columns whose order must hold, or None)
    "sorted": (
        "SELECT f.k, d.s FROM f JOIN d ON f.k2 = d.k2 WHERE f.v % 3 = 0 ORDER BY d.s DESC, f.k",
        ["s", "k"],
    ),
    "sorted numeric": ("SELECT k2, v FROM f WHERE v % 5 = 0 ORDER BY k2, v", ["k2", "v"]),
    "grouped": ("SELECT k2 % 100 AS g, count(*) AS n, sum(v) AS v FROM f GROUP BY 1", None),
    "finished on the driver": ("SELECT k, v FROM f ORDER BY v DESC LIMIT 50", ["v"]),
    "empty": ("SELECT k, v FROM f WHERE v < 0 ORDER BY k", ["k"]),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("results")
    make_table(
        root, "f", "SELECT i AS k, (i * 7919) % 5000 AS k2, i AS v FROM range(100000) t(i)", 4, "hash", ("k",)
    )
    make_table(root, "d", "SELECT i AS k2, 'd' || i::VARCHAR AS s FROM range(5000) t(i)", 3)
    return root


def duckdb_copy(data: Path, sql: str, path: Path) -> pa.Table:
    """What single-process DuckDB's COPY writes for ``sql``, read back."""
    oracle(data).execute(f"COPY ({sql}) TO '{path}'")
    return pacsv.read_csv(path) if path.suffix == ".csv" else pq.read_table(path)


def check_outputs(db, data: Path, tmp: Path, ranks: int) -> None:
    for i, (name, (sql, order)) in enumerate(QUERIES.items()):
        expected = duckdb_copy(data, sql, tmp / f"duckdb{i}.parquet")
        directory = tmp / f"parts{i}"
        result = db.sql(sql, output=f"{directory}/")
        assert result.arrow().num_rows == 0 and result.outcome.rows_written == expected.num_rows
        assert_same(read_parts(directory), expected, order_by=order)
        passed_on = name not in ("finished on the driver",)
        assert len(list(directory.glob("part-*.parquet"))) == (ranks if passed_on else 1), name
        single = tmp / f"single{i}.parquet"
        db.sql(sql, output=str(single))
        assert_same(pq.read_table(single), expected, order_by=order)


@pytest.mark.parametrize(("transport", "ranks"), [("threads", 2), ("threads", 3), ("mpi", 2), ("mpi", 3)])
def test_results_to_files_match_duckdb(data, tmp_path, transport, ranks):
    with duckflock.connect(str(data), ranks=ranks, transport=transport, config=CONFIG) as db:
        check_outputs(db, data, tmp_path, ranks)


def test_a_tiny_exchange_budget_still_writes_files(data, tmp_path):
    # The DuckDB writing a result takes its memory out of the exchange's part of the budget: 1 byte
    # of it once left the writer no room to pin a block.
    config = {**CONFIG, "exchange_memory_bytes": 1}
    with duckflock.connect(str(data), ranks=2, transport="threads", config=config) as db:
        check_outputs(db, data, tmp_path, 2)


@pytest.mark.parametrize(
    ("sql", "config"),
    [
        # A scan and filter, in a process of more ranks than cores (one core, see one_core).
        ("SELECT k, v FROM f WHERE v % 7 = 0", {"shared_storage": False}),
        # A join with d read whole by every rank from shared storage.
        (
            "SELECT f.k, d.s FROM f JOIN d ON f.k2 = d.k2 WHERE f.v % 3 = 0",
            {"shared_storage": True, "broadcast_threshold_bytes": 1 << 30},
        ),
    ],
)
@pytest.mark.parametrize("ranks", [2, 4])
def test_every_rank_writes_its_share_where_stages_could_run_once_per_process(
    data, tmp_path, sql, config, ranks
):
    """A stage that could run once for all of a process's ranks (exec/resources/fused.py) runs on each rank
    when its rows are the result's as they are: each rank's part holds that rank's rows, not the
    first rank's part all of them."""
    expected = oracle(data).sql(sql).to_arrow_table()
    directory = tmp_path / "out"
    with (
        one_core(),
        duckflock.connect(
            str(data), ranks=ranks, transport="threads", config={**config, "fuse_min_bytes": 0}
        ) as db,
    ):
        db.sql(sql, output=f"{directory}/")
    assert_same(read_parts(directory), expected)
    rows = [pq.read_metadata(part).num_rows for part in sorted(directory.glob("part-*.parquet"))]
    assert len(rows) == ranks and all(rows), rows  # f's 4 partitions: one or two on every rank


def test_directory_replaces_earlier_parts_and_csv_streams(data, tmp_path):
    directory = tmp_path / "out"
    directory.mkdir()
    (directory / "part-00007-00000.parquet").write_bytes(b"from an earlier run on more ranks")
    sql = "SELECT k, v FROM f WHERE v % 7 = 0"
    expected = oracle(data).sql(sql).to_arrow_table()
    with duckflock.connect(str(data), ranks=2, transport="threads", config=CONFIG) as db:
        db.sql(sql, output=str(directory))  # an existing directory, without the trailing slash
        assert_same(read_parts(directory), expected)
        db.sql(sql, output=str(tmp_path / "r.csv"))
        assert_same(pacsv.read_csv(tmp_path / "r.csv"), expected)
        (directory / "notes.txt").write_text("not a part")  # read back, it would join the result
        with pytest.raises(duckflock.DuckflockError, match="holds other files"):
            db.sql(sql, output=str(directory))
        # Another tool's parts (Spark's), or a table's own files, are not ours to replace.
        spark = tmp_path / "spark"
        spark.mkdir()
        (spark / "part-00000-1b2c.snappy.parquet").write_bytes(b"someone else's")
        with pytest.raises(duckflock.DuckflockError, match="holds other files"):
            db.sql(sql, output=str(spark))
        assert (spark / "part-00000-1b2c.snappy.parquet").read_bytes() == b"someone else's"
        with pytest.raises(duckflock.ExecutionError):
            db.sql("SELECT CAST('x' || k AS INTEGER) AS n FROM f", output=str(tmp_path / "bad.parquet"))
        with pytest.raises(duckflock.ExecutionError):
            db.sql("SELECT CAST('x' || k AS INTEGER) AS n FROM f", output=str(tmp_path / "bad") + "/")
    assert not (tmp_path / "bad.parquet").exists()
    assert not list((tmp_path / "bad").iterdir()), "a failed query leaves no part and no _SUCCESS"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_cli_writes_parts_on_mpi_ranks(data, tmp_path):
    sql, order = QUERIES["sorted"]
    env = {**os.environ, **{f"DUCKFLOCK_{k.upper()}": str(v) for k, v in CONFIG.items()}}
    argv = [sys.executable, "-m", "duckflock.cli.main", "sql", "--data", str(data), "--ranks", "3"]
    proc = subprocess.run(
        [*argv, "--output", f"{tmp_path}/out/", sql], env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    expected = oracle(data).sql(sql).to_arrow_table()
    assert f"wrote {expected.num_rows} rows" in proc.stdout
    assert_same(read_parts(tmp_path / "out"), expected, order_by=order)


def test_flight_caller_streams_the_result_file(data, tmp_path):
    from flight_support import Workers

    sql, order = QUERIES["sorted"]
    with (
        Workers(data, 2, tmp_path) as w,
        duckflock.connect(workers=w.addresses, token=w.token, config=CONFIG) as db,
    ):
        result = db.sql(sql, output=str(tmp_path / "r.arrow"))
        assert_same(
            pa.ipc.open_file(tmp_path / "r.arrow").read_all(), oracle(data).sql(sql).to_arrow_table(), order
        )
        assert result.outcome.rows_written > 0
        with pytest.raises(duckflock.DuckflockError, match="not a directory"):
            db.sql(sql, output=f"{tmp_path}/parts/")


@pytest.mark.parametrize("transport", ["threads", "mpi"])
def test_files_are_what_duckdb_copy_writes_and_progress_finishes(data, tmp_path, transport):
    """Ranks exchange lossless Arrow types (UUID, HUGEINT, ...); DuckDB writes the files from them,
    so they hold what its own COPY writes (a UUID, a HUGEINT as DOUBLE, an INTERVAL; a CSV byte for
    byte). Progress reaches every stage though the gather never runs."""
    sql = (
        "SELECT k, ('00000000-0000-4000-8000-' || lpad(k::VARCHAR, 12, '0'))::UUID AS u, "
        "k::HUGEINT * 3 AS h, make_time(1, 2, k % 60) AS t, INTERVAL (k) DAY AS iv FROM f WHERE v % 11 = 0"
    )
    expected = duckdb_copy(data, sql, tmp_path / "duckdb.parquet")
    seen = []
    with duckflock.connect(str(data), ranks=3, transport=transport, config=CONFIG) as db:
        db.sql(sql, output=f"{tmp_path}/parts/", progress=seen.append)
        db.sql(sql, output=str(tmp_path / "one.parquet"))
        db.sql(sql + " ORDER BY k", output=str(tmp_path / "one.csv"))
    assert seen and seen[-1].finished  # every stage reported, none waited for in vain
    for table in (read_parts(tmp_path / "parts"), pq.read_table(tmp_path / "one.parquet")):
        assert table.schema.equals(expected.schema), (table.schema, expected.schema)
        assert_same(table, expected)
    duckdb_copy(data, sql + " ORDER BY k", tmp_path / "duckdb.csv")
    assert (tmp_path / "one.csv").read_bytes() == (tmp_path / "duckdb.csv").read_bytes()


@pytest.mark.parametrize("transport", ["threads", "mpi"])
def test_a_result_duckdb_cannot_write_fails_cleanly_and_the_session_goes_on(data, tmp_path, transport):
    """A LIST of VARIANT, which DuckDB's own COPY cannot put into Parquet: written by the ranks
    (parts) or by the driver (one file), the query reports DuckDB's reason, no file is left, and the
    next query runs (a rank's loop had died of a failed part file)."""
    sql = "SELECT k, [k::VARIANT] AS v FROM f WHERE k < 100"
    with duckflock.connect(str(data), ranks=2, transport=transport, config=CONFIG) as db:
        for output in (f"{tmp_path}/parts/", str(tmp_path / "one.parquet")):
            with pytest.raises(duckflock.DuckflockError, match=r"cannot be written as parquet.*VARIANT"):
                db.sql(sql, output=output)
            assert not list(tmp_path.glob("**/*.parquet"))
            # The error returns as soon as one rank reports it; the others remove their files as
            # they end the query.
            deadline = time.monotonic() + BOUND_S
            while list(tmp_path.glob("**/.*")):
                assert time.monotonic() < deadline, list(tmp_path.glob("**/.*"))
                time.sleep(0.05)
        db.sql(sql, output=str(tmp_path / "one.arrow"))  # Arrow IPC holds it
        got = pa.ipc.open_file(tmp_path / "one.arrow").read_all()
        assert_same(got, oracle(data).sql(sql).to_arrow_table())
        assert (
            db.sql("SELECT count(*) FROM f").fetchall()
            == oracle(data).sql("SELECT count(*) FROM f").fetchall()
        )
