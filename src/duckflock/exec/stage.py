"""Run one stage on this rank: register its exchange inputs, run its DuckDB query, stream the output
into its exchange (or return it, for the final stage)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa

from duckflock.catalog import Catalog
from duckflock.catalog.partitioning import Hashed, Ranged, canonical_hash_type, hash_sql
from duckflock.catalog.partitioning import quote_ident as q
from duckflock.exchange.codec import write_options
from duckflock.exchange.inputs import QueryInputs
from duckflock.exchange.shuffle import ExchangeStats, ExchangeWriter
from duckflock.exec import adaptive, range_sort, skew
from duckflock.exec.result_files import ResultWriter
from duckflock.exec.runtime import Runtime
from duckflock.local_duckdb import fetch_as_duckdb_returns
from duckflock.plan.nodes import DriverQuery, ExchangeRead, Scan
from duckflock.plan.render import exchange_table, render
from duckflock.plan.stages import ExchangeSpec, Stage, StagePlan
from duckflock.sqltext import sql_literal
from duckflock.units import human


@dataclass
class StageStats:
    sid: int
    rank: int
    compute_s: float = 0.0  # DuckDB producing the stage's rows (scan, join, aggregate, ...)
    total_s: float = 0.0
    exchange: ExchangeStats = field(default_factory=ExchangeStats)
    fell_back: bool = False  # a measured broadcast was larger than the threshold: hashed instead
    note: str = ""  # what a measured broadcast found, for the profile
    received: dict[int, int] = field(default_factory=dict)  # rows taken from each exchange read

    def set_note(self, text: str) -> None:
        self.note = text


def scan_source(catalog: Catalog, rank: int, size: int):
    """FROM item for a Scan on this rank: its partitions' files (all of them when replicated)."""

    def source(scan: Scan) -> str:
        info = catalog.table(scan.table)
        parts = range(len(info.partitions)) if scan.replicated else info.partitions_of_rank(rank, size)
        files = [catalog.path(f) for p in parts for f in info.partitions[p].files]
        empty = not files
        if empty:  # an empty relation with the table's exact schema
            files = [catalog.path(f) for p in info.partitions for f in p.files][:1]
        if not files:  # a table without any file (zero rows loaded): its schema from the catalog
            cols = ", ".join(f"CAST(NULL AS {t}) AS {q(c)}" for c, t in info.columns)
            return f"(SELECT {cols} LIMIT 0)"
        listing = "[" + ", ".join(sql_literal(f) for f in files) + "]"
        if info.format == "csv":
            opts = "".join(f", {k} = {sql_literal(v)}" for k, v in info.csv_options.items())
            cols = ", ".join(f"{sql_literal(c)}: {sql_literal(t)}" for c, t in info.columns)
            rel = f"read_csv({listing}, columns = {{{cols}}}{opts})"
        else:
            rel = f"read_parquet({listing})"
        return f"(SELECT * FROM {rel} LIMIT 0)" if empty else rel

    return source


def target_sql(spec: ExchangeSpec, size: int) -> str:
    """SQL computing each row's target rank, evaluated by DuckDB inside the producing query."""
    target = spec.target
    if isinstance(target, Hashed):
        keys = list(spec.keys)
        if all(t == "" for t in target.key_types):
            part = f"(hash({', '.join(keys)}) % {target.count})"
        else:
            part = hash_sql(keys, target.key_types, target.count)
        return f"CAST({part} % {size} AS USMALLINT)"
    if isinstance(target, Ranged):
        # Partition p holds keys up to its upper bound; keys in no partition's range match nothing
        # on the other side, so any target is correct for them.
        bounds = sorted((b[1], p) for p, b in enumerate(target.bounds) if b is not None)
        # Compare in the key's canonical type: the other side's keys may not fit the range key's type.
        key = f"CAST({spec.keys[0]} AS {canonical_hash_type(target.key_type)})"
        whens = " ".join(f"WHEN {key} <= {sql_literal(hi)} THEN {p % size}" for hi, p in bounds)
        last = bounds[-1][1] % size if bounds else 0
        return f"CAST(CASE {whens} ELSE {last} END AS USMALLINT)"
    raise ValueError(f"exchange {spec.xid} of kind {spec.kind} has no target function")


def run_stage(
    rt: Runtime,
    qid: int,
    plan: StagePlan,
    stage: Stage,
    received: QueryInputs,
    shuffled: set[int],
    part: ResultWriter | None = None,
    hot: skew.HotKeys | None = None,
) -> tuple[pa.Table | None, StageStats]:
    """``shuffled``: the measured broadcasts that fell back so far (which plan each AdaptiveJoin runs).
    ``part``: this rank's result file, written instead of sending the stage's output (a gather).
    ``hot``: the query's hot join keys so far (found by spreading stages, used by replicating ones)."""
    if rt.config.stage_gate_dir:
        _wait_at_gate(rt, qid, stage.sid)
    stats = StageStats(stage.sid, rt.rank)
    t_start = time.perf_counter()
    registered = []
    root = adaptive.resolve(stage.root, shuffled)
    taken = adaptive.reads(root)
    # The final stage, on the driver, may run on a DuckDB with every core of the node.
    con = rt.final_connection() if stage.on_driver and stage.output is None else rt.con
    try:
        inputs = {}
        for xid in taken:
            inputs[xid] = received.take(xid, stats.exchange)
            stats.received[xid] = inputs[xid].num_rows
            name = exchange_table(xid)
            con.register(name, inputs[xid])
            registered.append(name)
        spec = stage.output
        if spec is None and isinstance(root, ExchangeRead):
            # rows arrive in their final order: no DuckDB pass, unless a type needs converting back
            table = inputs[root.xid]
            if any(isinstance(f.type, pa.BaseExtensionType) for f in table.schema):
                table = fetch_as_duckdb_returns(con, f"SELECT * FROM {exchange_table(root.xid)}", True)
            return table, stats
        assert rt.catalog is not None
        sql = render(root, scan_source(rt.catalog, rt.rank, rt.size))
        if spec is None:
            t0 = time.perf_counter()
            result = fetch_as_duckdb_returns(con, sql, keep_order=isinstance(root, DriverQuery))
            stats.compute_s += time.perf_counter() - t0
            return result, stats
        spreads = skew.applies(spec)
        if spec.kind in ("hash", "range"):
            sql = skew.with_key_hash(spec, sql) if spreads else sql
            sql = f"SELECT *, {target_sql(spec, rt.size)} AS __target FROM ({sql})"
            if spec.local:  # every rank holds all rows: keep this rank's share, send no copies
                sql = f"SELECT * FROM ({sql}) WHERE __target = {rt.rank}"
        elif spec.fallback_target is not None:  # measured: each row's target, should it be hashed
            fallback = replace(spec, kind="hash", keys=spec.fallback_keys, target=spec.fallback_target)
            sql = f"SELECT *, {target_sql(fallback, rt.size)} AS __target FROM ({sql})"
        elif spec.kind == "sort":
            # Splitters come from samples of this stage's output: materialize it first.
            t0 = time.perf_counter()
            table = con.sql(sql).to_arrow_table()
            fast = range_sort.fast_targets(rt, qid, table, spec.keys)
            if fast is not None:  # one numeric key: bucket with numpy, no second DuckDB pass
                sql = None
                table = table.append_column("__target", pa.array(fast))
            else:
                con.register("__sort_input", table)
                registered.append("__sort_input")
                targets = range_sort.target_sql(rt, qid, "__sort_input", spec.keys)
                registered.append("__splitters")
                sql = f"SELECT *, {targets} AS __target FROM __sort_input"
            stats.compute_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        if sql is None:
            schema, batches = table.schema, table.to_batches(rt.config.batch_rows)
            del table  # each batch is dropped once split, so the output is not held twice
            reader = pa.RecordBatchReader.from_batches(schema, _drain(batches))
        else:
            reader = con.sql(sql).to_arrow_reader(rt.config.batch_rows)
        if spreads:
            reader = skew.route(rt, qid, spec, reader, {} if hot is None else hot, stats.set_note)
        kind, held, schema = spec.kind, [], reader.schema
        measured = spec.fallback_target is not None
        threshold = spec.fallback_above if measured else rt.config.broadcast_threshold_bytes
        if measured:
            held, local = adaptive.measure(reader, threshold)
            total = adaptive.agree(rt, qid, local)
            stats.fell_back = total > threshold
            kind = "hash" if stats.fell_back else "broadcast"
            how = "hashed on the join keys instead of broadcast" if stats.fell_back else "broadcast"
            at_least = "at least " if stats.fell_back else ""  # ranks stop reading past the threshold
            total_s = f"{at_least}{human(total, 'B')}"
            stats.note = f"x{spec.xid}: {total_s} on all ranks, threshold {human(threshold, 'B')}: {how}"
            if not stats.fell_back:  # drop the target column computed in case of a fall-back
                held = [b.drop_columns(["__target"]) for b in held]
                schema = schema.remove(len(schema) - 1)
        writer = part or ExchangeWriter(
            rt.mux,
            qid,
            spec.xid,
            kind,
            plan.receivers(spec.xid, rt.size),
            rt.config.chunk_bytes,
            write_options(rt.config.compression),
            stats.exchange,
        )
        strip = kind == "broadcast" and measured
        written = 0
        for batch in held:
            writer.write(batch)
            written += batch.nbytes
        del held
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            t1 = time.perf_counter()
            stats.compute_s += t1 - t0
            if strip:
                batch = batch.drop_columns(["__target"])
            writer.write(batch)
            written += batch.nbytes
            t0 = time.perf_counter()
        stats.compute_s += time.perf_counter() - t0
        if part is None:
            writer.close(schema)  # type: ignore[union-attr]
        else:
            stats.exchange.rows_out = part.rows
        if kind == "broadcast" and not measured and written > threshold:
            stats.note = (
                f"x{spec.xid}: broadcast {human(written, 'B')} from this rank, over the threshold of "
                f"{human(threshold, 'B')}; not measured in advance: no shuffle gives the same rows"
            )
        return None, stats
    finally:
        for name in registered:
            con.unregister(name)
        for xid in taken:
            received.done(xid)
        stats.total_s = time.perf_counter() - t_start


def _wait_at_gate(rt: Runtime, qid: int, sid: int) -> None:
    """The ``stage_gate_dir`` test hook: announce this stage, then hold while the test says so."""
    gate = Path(rt.config.stage_gate_dir)
    (gate / f"rank{rt.rank}.stage{sid}").write_text(str(os.getpid()))  # the process a test may kill
    while (gate / "hold").exists():
        failure = rt.mux.failure(qid)
        if failure is not None:
            raise failure.error()
        time.sleep(0.02)


def _drain(batches: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Yield the batches, letting go of each one as it is handed out."""
    batches.reverse()
    while batches:
        yield batches.pop()
