"""A repartitioning load's rows sent to the ranks that own their partitions, and written there.

Each rank scans its share of the inputs once; DuckDB computes each row's partition and the rank
that owns it (partition ``p`` lives on rank ``p % ranks``, where queries read it); the rows go
through the exchange queries use (exchange/shuffle.py: batches split by target as DuckDB produces
them, a rank's own rows never serialized, received rows past the rank's budget spilled to a local
file). Each rank then writes the partitions it owns: one file each (more where DuckDB splits a large
one), not one per partition and rank, which matters most for objects (few, larger objects read
faster than many small ones).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb
import pyarrow as pa

from duckflock.errors import CatalogError
from duckflock.exchange.codec import write_options
from duckflock.exchange.inputs import QueryInputs
from duckflock.exchange.kinds import ExchangeKind
from duckflock.exchange.shuffle import ExchangeStats, ExchangeWriter
from duckflock.exchange.spill import QuerySpill
from duckflock.exec.control.rank_query import describe_error
from duckflock.exec.resources.runtime import Runtime
from duckflock.local_duckdb import arrow_exact
from duckflock.plan.sql_text import copy_partitioned, read_files
from duckflock.sqltext import quote_ident as q

_XID = 0  # a load runs one exchange
_TARGET = "__duckflock_target"
_RECEIVED = "__duckflock_load_rows"

Columns = tuple[tuple[str, str], ...]


def shuffle_partitions(
    rt: Runtime,
    qid: int,
    scan: str,
    part_sql: str,
    part_column: str,
    staging: Path,
    columns: Columns,
    inputs_named: str,
) -> dict[int, list[Path]]:
    """Send the rows of ``scan`` (this rank's share, of the inputs ``inputs_named``; no rows where
    it has none) to the ranks owning their partition (``part_sql``), and write the partitions this
    rank owns to ``staging/part-<p>-r<rank>.parquet``; each file must read back with ``columns``.
    Every rank calls it, also one with no inputs: each receiver waits for every sender's end."""
    spill = QuerySpill(rt.spill_dir, rt.budget.exchange_bytes if rt.budget is not None else 0)
    inputs = QueryInputs(rt.mux, qid, spill, rt.config.chunk_bytes)
    everyone = list(range(rt.size))
    inputs.start(_XID, everyone, ordered=False)
    try:
        _send(rt, qid, scan, part_sql, part_column, everyone)
        received = inputs.take(_XID, ExchangeStats())
        written = _write_owned(rt, received, part_column, staging)
        inputs.done(_XID)
    except Exception as e:
        error = CatalogError(f"loading {inputs_named} failed: {e}") if isinstance(e, duckdb.Error) else e
        # Told to every rank (unless one failed first) before this one waits for its receivers
        # below: they wait for rows from the other ranks, which wait for this rank's (a bad CSV line
        # on one rank would hold the others waiting).
        rt.mux.report_failure(qid, None, describe_error(error))
        raise error from e
    finally:
        inputs.close()
    _check_columns(rt, written, columns)
    return written


def _send(rt: Runtime, qid: int, scan: str, part_sql: str, part_column: str, everyone: list[int]) -> None:
    chunk = rt.config.chunk_bytes
    writer = ExchangeWriter(
        rt.mux, qid, _XID, ExchangeKind.HASH, everyone, chunk, write_options(rt.config.compression)
    )
    parted = f"SELECT *, {part_sql} AS {q(part_column)} FROM {scan}"
    routed = f"SELECT *, CAST({q(part_column)} % {rt.size} AS USMALLINT) AS {q(_TARGET)} FROM ({parted})"
    reader = rt.con.sql(arrow_exact(rt.con, routed)).to_arrow_reader(rt.config.batch_rows)
    try:
        for batch in reader:
            writer.write(batch)
        writer.close(reader.schema)
    except OSError as e:  # DuckDB's error, as pyarrow's reader passes it on: DuckDB's again
        interrupted = str(e).startswith("INTERRUPT")
        raise (duckdb.InterruptException if interrupted else duckdb.Error)(str(e)) from e
    finally:
        reader.close()


def _write_owned(rt: Runtime, received: pa.Table, part_column: str, staging: Path) -> dict[int, list[Path]]:
    """The received rows, split by partition, as staging/part-<p>-r<rank>.parquet (one scan)."""
    if received.num_rows == 0:
        return {}
    scratch = staging / f"r{rt.rank}"
    shutil.rmtree(scratch, ignore_errors=True)
    rt.con.register(_RECEIVED, received)
    try:
        rt.con.execute(copy_partitioned(q(_RECEIVED), part_column, str(scratch)))
    finally:
        rt.con.unregister(_RECEIVED)
    out: dict[int, list[Path]] = {}
    # DuckDB writes hive-style directories <column>=<p>/ that hold only non-empty partitions.
    for d in sorted(scratch.iterdir()):
        p = int(d.name.split("=", 1)[1])
        for i, f in enumerate(sorted(d.glob("*.parquet"))):
            name = f"part-{p}-r{rt.rank}.parquet" if i == 0 else f"part-{p}-r{rt.rank}-{i}.parquet"
            os.replace(f, staging / name)
            out.setdefault(p, []).append(staging / name)
    shutil.rmtree(scratch, ignore_errors=True)
    return out


def _check_columns(rt: Runtime, written: dict[int, list[Path]], columns: Columns) -> None:
    """Rows that crossed ranks as Arrow must read back with the table's columns (its catalog entry
    says so): refuse a type the exchange would have changed, naming the column."""
    first = next((fs[0] for fs in written.values()), None)
    if first is None:
        return
    described = rt.con.execute(f"DESCRIBE SELECT * FROM {read_files('parquet', [first])}").fetchall()
    got = tuple((r[0], r[1]) for r in described)
    for (name, want), have in zip(columns, got, strict=False):
        if (name, want) != have:
            raise CatalogError(
                f"column {name!r} of type {want} cannot be repartitioned (it reads back as "
                f"{have[1]} after crossing ranks): load the files unpartitioned"
            )
    if len(got) != len(columns):
        raise CatalogError(f"repartitioned files have the columns {list(got)}, not {list(columns)}")
