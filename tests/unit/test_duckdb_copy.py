"""Result files written by DuckDB's COPY from batches as they arrive (exec/results/duckdb_copy.py)."""

from __future__ import annotations

import duckdb
import pyarrow as pa

from duckflock.exec.results.result_files import ResultWriter


def _batches(rows: int, n: int) -> tuple[pa.Schema, list[pa.RecordBatch], list[str]]:
    con = duckdb.connect()
    table = con.sql(f"SELECT i, 'v' || i AS s FROM range({rows * n}) r(i)").to_arrow_table()
    return table.schema, table.to_batches(max_chunksize=rows), ["BIGINT", "VARCHAR"]


def test_the_file_appears_complete_under_its_name_and_nothing_else_is_left(tmp_path):
    """COPY writes straight into the writer's hidden temporary file: DuckDB's own temporary file
    (tmp_<name>) was left behind, visible, when a rank was killed mid-write."""
    schema, batches, types = _batches(1000, 5)
    writer = ResultWriter(tmp_path / "out.csv", schema, types)
    for batch in batches:
        writer.write(batch)
    assert all(p.name.startswith(".out.csv.") for p in tmp_path.iterdir()), list(tmp_path.iterdir())
    writer.commit()
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]
    want = tmp_path / "want.csv"
    duckdb.connect().execute(f"COPY (SELECT i, 'v' || i AS s FROM range(5000) r(i)) TO '{want}'")
    assert (tmp_path / "out.csv").read_bytes() == want.read_bytes()


def test_abort_after_the_last_batch_stops_the_copy_and_leaves_nothing(tmp_path):
    """Ctrl-C while commit waits for COPY to finish the file: abort interrupts it rather than
    waiting for the whole file, and removes it."""
    schema, batches, types = _batches(500_000, 4)
    writer = ResultWriter(tmp_path / "big.csv", schema, types)
    for batch in batches:
        writer.write(batch)
    writer.abort()
    assert not list(tmp_path.iterdir())
