"""How a stage's rows leave it on this rank: each row's target appended where rows are routed (a
sort's splitters sampled first), a measured broadcast or hot keys decided on the way, and the batches
streamed into the exchange's writer, or into this rank's part file when its rows are the result's."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from duckflock.arrays import arrow_array
from duckflock.catalog.placement import SPLITTERS_TABLE, target_sql
from duckflock.exchange.codec import write_options
from duckflock.exchange.kinds import ExchangeKind
from duckflock.exchange.shuffle import ExchangeWriter
from duckflock.exec.resources.memory import release_free_memory
from duckflock.exec.results.result_files import ResultWriter
from duckflock.exec.stages import adaptive, partition_runs, range_sort, skew
from duckflock.exec.stages.run import StageRun, draining, raise_failure
from duckflock.local_duckdb import arrow_exact
from duckflock.plan.kinds import SkewRole
from duckflock.plan.nodes import Node
from duckflock.plan.render import render
from duckflock.plan.skew import rescannable
from duckflock.plan.sql_text import (
    TARGET_COLUMN,
    everything,
    own_share,
    with_key_hash,
    with_key_hashes,
    with_target,
)
from duckflock.plan.stages import ExchangeSpec, StagePlan
from duckflock.units import human

_SORT_INPUT = "__sort_input"  # a sort stage's rows, materialized to sample splitters from


def send(run: StageRun, plan: StagePlan, spec: ExchangeSpec, root: Node, part: ResultWriter | None) -> None:
    """Stream the stage's rows into its exchange (or into ``part``) while DuckDB produces them."""
    with run.profiled():
        _send_rows(run, plan, spec, root, part)


def _send_rows(
    run: StageRun, plan: StagePlan, spec: ExchangeSpec, root: Node, part: ResultWriter | None
) -> None:
    rt, stats = run.rt, run.stats
    sql = run.sql(root)
    routed = _routed(run, spec, sql)
    queried = isinstance(routed, str)  # else a sort's rows, their scans' profile already taken
    t0 = time.perf_counter()  # from here on DuckDB produces the rows as they are read
    with run.planning():
        reader = _reader(run, routed)
    del routed  # a materialized sort input lives on only in the reader's batches
    if skew.applies(spec):
        again = spec.skew is SkewRole.SPREAD and rescannable(root)
        restart = _restart_without(run, spec, sql) if again else None
        reader = skew.route(rt, run.qid, spec, reader, run.hot, stats.set_note, restart)
    if run.overlap is not None:
        run.overlap.started.set()
    out = _Output(spec.kind, [], reader.schema)
    if spec.fallback_target is not None:
        out = _measure(run, spec, reader)
    writer = part or _writer(run, plan, spec, out.kind)
    written = _write(run, writer, out, reader, t0)
    if queried:
        run.take_profile()
    _close(run, writer, out.schema)
    _note_broadcast(run, out.kind, spec, written)


def _restart_without(run: StageRun, spec: ExchangeSpec, sql: str) -> skew.Restart:
    """How a spreading stage's query restarts without the rows of some key hashes, which the stage
    reading its exchange reads again itself (exec/stages/skew.py)."""
    target = spec.target
    assert target is not None

    def restart(hashes: np.ndarray) -> tuple[pa.RecordBatchReader, str]:
        without = with_key_hashes(sql, spec.keys, target, hashes.tolist(), among=False)
        with run.planning():
            reader = _reader(run, _routed(run, spec, without))
        return reader, with_key_hashes(sql, spec.keys, target, hashes.tolist(), among=True)

    return restart


def send_in_groups(
    run: StageRun,
    plan: StagePlan,
    spec: ExchangeSpec,
    root: Node,
    part: ResultWriter | None,
    split: partition_runs.PartitionGroups,
) -> None:
    """``send`` once per group of partitions, all into one writer: ``split`` rules out hot keys,
    measured broadcasts, sorts and streams."""
    rt = run.rt
    assert rt.catalog is not None
    writer = part or _writer(run, plan, spec, spec.kind)
    written = 0
    schema = None
    for group in split.groups:
        raise_failure(rt, run.qid)  # another rank failed meanwhile: no more runs
        split.read_group(run.con, group)
        sql = render(root, run.source(group, root))
        t0 = time.perf_counter()
        reader = _reader(run, _routed(run, spec, sql))
        try:
            schema = reader.schema
            written += _write(run, writer, _Output(spec.kind, [], schema), reader, t0)
            run.take_profile()
        finally:
            reader.close()  # an open result would keep its views from being dropped
        release_free_memory()  # the run's hash tables, before the next run builds its own
    assert schema is not None
    _close(run, writer, schema)
    run.stats.set_note(split.note())
    _note_broadcast(run, spec.kind, spec, written)


def end_without_rows(
    run: StageRun, plan: StagePlan, spec: ExchangeSpec, part: ResultWriter | None, schema: pa.Schema
) -> None:
    """End the stage's output (or ``part``) with no rows of its own: another rank of this process
    sent them (exec/resources/fused.py)."""
    _close(run, part or _writer(run, plan, spec, spec.kind), schema)


def _writer(run: StageRun, plan: StagePlan, spec: ExchangeSpec, kind: ExchangeKind) -> ExchangeWriter:
    rt = run.rt
    return ExchangeWriter(
        rt.mux,
        run.qid,
        spec.xid,
        kind,
        plan.receivers(spec.xid, rt.size),
        rt.config.chunk_bytes,
        write_options(rt.config.compression),
        run.stats.exchange,
    )


def _close(run: StageRun, writer: ExchangeWriter | ResultWriter, schema: pa.Schema) -> None:
    run.sent_schema = schema
    if isinstance(writer, ExchangeWriter):
        writer.close(schema)
    else:
        run.stats.exchange.rows_out = writer.rows


def _note_broadcast(run: StageRun, kind: ExchangeKind, spec: ExchangeSpec, written: int) -> None:
    """A broadcast the planner could not measure first, larger than the threshold: say so."""
    threshold = run.rt.config.broadcast_threshold_bytes
    if kind is ExchangeKind.BROADCAST and spec.fallback_target is None and written > threshold:
        run.stats.note = (
            f"x{spec.xid}: broadcast {human(written, 'B')} from this rank, over the threshold of "
            f"{human(threshold, 'B')}; not measured in advance: no shuffle gives the same rows"
        )


def _routed(run: StageRun, spec: ExchangeSpec, sql: str) -> str | pa.Table:
    """The stage's query with each row's target rank appended where rows are routed; for a sort,
    its rows (already computed) with their targets."""
    size = run.rt.size
    if spec.kind in (ExchangeKind.HASH, ExchangeKind.RANGE):
        assert spec.target is not None
        if skew.applies(spec):  # the key hashes name hot keys (exec/stages/skew.py)
            sql = with_key_hash(sql, spec.keys, spec.target)
        sql = with_target(sql, target_sql(spec.keys, spec.target, size))
        # every rank holds all rows: keep this rank's share, send no copies
        return own_share(sql, run.rt.rank) if spec.local else sql
    if spec.fallback_target is not None:  # measured: each row's target, should it be hashed
        return with_target(sql, target_sql(spec.fallback_keys, spec.fallback_target, size))
    if spec.kind is ExchangeKind.SORT:
        return _sorted(run, spec, sql)
    return sql


def _sorted(run: StageRun, spec: ExchangeSpec, sql: str) -> str | pa.Table:
    """Splitters come from samples of this stage's output: materialize it first."""
    t0 = time.perf_counter()
    table = run.con.sql(arrow_exact(run.con, sql, exchanged=True)).to_arrow_table()
    run.take_profile()
    fast = range_sort.fast_targets(run.rt, run.qid, table, spec.keys)
    if fast is not None:  # one numeric key: bucket with numpy, no second DuckDB pass
        routed: str | pa.Table = table.append_column(TARGET_COLUMN, arrow_array(fast))
    else:
        run.register(_SORT_INPUT, table)
        targets = range_sort.target_sql(run.rt, run.qid, _SORT_INPUT, spec.keys)
        run.registered.append(SPLITTERS_TABLE)
        routed = with_target(everything(_SORT_INPUT), targets)
    run.stats.compute_s += time.perf_counter() - t0
    return routed


def _reader(run: StageRun, routed: str | pa.Table) -> pa.RecordBatchReader:
    batch_rows = run.rt.config.batch_rows
    if isinstance(routed, str):
        run.readers.append(
            run.con.sql(arrow_exact(run.con, routed, exchanged=True)).to_arrow_reader(batch_rows)
        )
        return run.readers[-1]
    # each batch is dropped once split, so the output is not held twice
    return draining(routed, batch_rows)


@dataclass
class _Output:
    """What the stage sends: through which kind of exchange, the batches already read, the schema."""

    kind: ExchangeKind
    held: list[pa.RecordBatch]
    schema: pa.Schema
    strip_target: bool = False  # a measured broadcast drops the target computed for a fall-back


def _measure(run: StageRun, spec: ExchangeSpec, reader: pa.RecordBatchReader) -> _Output:
    """A measured broadcast: all ranks agree on its total size, then broadcast or hash it."""
    stats, threshold = run.stats, spec.fallback_above
    held, local = adaptive.measure(reader, threshold)
    total = adaptive.agree(run.rt, run.qid, local)
    stats.fell_back = total > threshold
    how = "hashed on the join keys instead of broadcast" if stats.fell_back else "broadcast"
    at_least = "at least " if stats.fell_back else ""  # ranks stop reading past the threshold
    total_s = f"{at_least}{human(total, 'B')}"
    stats.note = f"x{spec.xid}: {total_s} on all ranks, threshold {human(threshold, 'B')}: {how}"
    if stats.fell_back:
        return _Output(ExchangeKind.HASH, held, reader.schema)
    held = [b.drop_columns([TARGET_COLUMN]) for b in held]
    schema = reader.schema.remove(len(reader.schema) - 1)
    return _Output(ExchangeKind.BROADCAST, held, schema, strip_target=True)


def _write(
    run: StageRun,
    writer: ExchangeWriter | ResultWriter,
    out: _Output,
    reader: pa.RecordBatchReader,
    t0: float,
) -> int:
    """Hand every batch to the writer; the bytes written. The time since ``t0`` not spent writing
    is DuckDB producing the batches: compute."""
    written = 0
    for batch in out.held:
        writer.write(batch)
        written += batch.nbytes
    out.held.clear()
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        t1 = time.perf_counter()
        run.stats.compute_s += t1 - t0
        if out.strip_target:
            batch = batch.drop_columns([TARGET_COLUMN])
        writer.write(batch)
        written += batch.nbytes
        t0 = time.perf_counter()
    run.stats.compute_s += time.perf_counter() - t0
    return written
