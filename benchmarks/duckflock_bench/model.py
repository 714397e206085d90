"""A performance model per phase, from machine constants (calibrate.py) and a plan's row and byte counts.

Per stage and rank, with ``c`` effective cores and per-thread rates (docs/model.md has the details):

* scan       = (V / scan_values_s + S / scan_string_Bps) / c      V values, S string bytes decoded
* operators  = (R_join / join_rows_s + R_agg / agg_rows_s + R_sort / sort_rows_s + B_out / arrow_Bps) / c
* partition  = B_out / partition_Bps + B_wire / ipc_Bps             split by target, IPC encoding
* network    = B_wire / net_Bps + messages * latency,  messages = pairs * max(1, ceil(B_pair / chunk))

The counts come from a profiled run (``measure_counts``): DuckDB's rows per operator, the catalog's
partitions for the scans, the exchange statistics. A query's time is its overhead
(``a + b * stages + c * ranks``) plus, stage after stage, the slowest rank's sum of the phases (no
overlap assumed), plus the driver's final stage (its ``scan`` + ``operators`` on all its cores).
``project`` scales the counts of one run to other scale factors and node counts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

from duckflock.catalog import Catalog
from duckflock.catalog.catalog import TableInfo
from duckflock.exchange.kinds import ExchangeKind
from duckflock.exec.reports import StageStats
from duckflock.plan.kinds import AggPhase
from duckflock.plan.nodes import Aggregate, Exchange, ExchangeRead, Filter, Project, Scan, walk
from duckflock.plan.stages import Stage

GB = 1e9
CHUNK_BYTES = 4 << 20  # the exchange's default message size (Config.chunk_bytes)
ROUTED = ("hash", "range", "sort")  # output kinds split by target rank
BROADCAST_LIMIT = 16 * 1024 * 1024  # Config.broadcast_threshold_bytes: larger inputs are hashed
# A partial aggregate whose output was at least this share of its input rows has groups that grow
# with the data (keys like orders); below it, a fixed set (Q1's flags, Q6's one row).
GROUPS_GROW = 0.01


@dataclass
class Counts:
    """What one stage handled on one rank: the model's input. ``*_whole`` counts come from inputs
    every rank has whole (replicated tables, broadcasts): they do not shrink as ranks are added."""

    sid: int
    rank: int
    final: bool
    out_kind: str  # hash/broadcast/gather/...; "" for the final stage
    partial_agg: bool = False  # its output is a partial aggregate (a rank's groups, not its rows)
    scan_values: float = 0.0  # fixed-width values decoded (rows x columns)
    scan_strings: float = 0.0  # string bytes decoded
    scan_whole_values: float = 0.0
    scan_whole_strings: float = 0.0
    join_rows: float = 0.0  # rows entering its joins (DuckDB's profile)
    join_whole: float = 0.0
    agg_rows: float = 0.0  # rows entering its grouped aggregates
    agg_whole: float = 0.0
    sort_rows: float = 0.0  # rows it sorts
    rows_out: float = 0.0
    bytes_out: float = 0.0  # all output as Arrow, local share included (the plan's row width)
    bytes_wire: float = 0.0  # measured bytes sent to other ranks
    targets: int = 0  # other ranks written to


@dataclass
class Constants:
    scan_values_s: float
    scan_string_gbps: float
    join_rows_s: float
    agg_rows_s: float
    sort_rows_s: float
    arrow_gbps: float
    ipc_gbps: float
    partition4_gbps: float
    partition64_gbps: float
    net_gbps: float  # bandwidth per rank or node (GB/s)
    latency_s: float  # per message
    overhead_s: float
    overhead_per_stage_s: float
    overhead_per_rank_s: float

    @classmethod
    def from_calibration(cls, c: dict[str, float], **override: float) -> Constants:
        """From ``bench calibrate``'s constants; the network's are MPI's unless overridden."""
        values = {f.name: c[f.name] for f in fields(cls) if f.name in c}
        values |= {"net_gbps": c["mpi_gbps"], "latency_s": c["mpi_latency_s"]} | override
        return cls(**values)


# Measuring: the counts of a profiled run.


def _scan_width(info: TableInfo, columns: list[str]) -> tuple[int, float]:
    """(fixed-width columns, string bytes) per row of a scan of ``columns``."""
    widths = dict(info.widths)
    types = dict(info.columns)
    strings = [c for c in columns if types.get(c, "").upper() in ("VARCHAR", "BLOB")]
    return len(columns) - len(strings), float(sum(widths.get(c, 16) for c in strings))


def _count_scans(c: Counts, stage: Stage, st: StageStats, catalog: Catalog, size: int) -> tuple[float, float]:
    """Add the stage's scans on the rank to ``c``; return the rows they read of partitioned and
    of replicated tables."""
    share = {s.table: s.row_groups_read / s.row_groups_total for s in st.scans if s.row_groups_total}
    part_rows = whole_rows = 0.0
    for node in (n for n in walk(stage.root) if isinstance(n, Scan)):
        info = catalog.table(node.table)
        parts = range(len(info.partitions)) if node.replicated else info.partitions_of_rank(st.rank, size)
        rows = sum(info.partitions[p].rows for p in parts) * share.get(node.table, 1.0)
        # Every column read is decoded for every row of the row groups read, whatever the filters
        # keep (measured: a filter keeping 1% of the rows costs what one keeping 50% does).
        width, string_bytes = _scan_width(info, list(node.source_columns))
        values, strings = rows * width, rows * string_bytes
        if node.replicated:
            c.scan_whole_values += values
            c.scan_whole_strings += strings
            whole_rows += rows
        else:
            c.scan_values += values
            c.scan_strings += strings
            part_rows += rows
    return part_rows, whole_rows


def _count_operators(
    c: Counts, stage: Stage, st: StageStats, by_sid: dict[int, Stage], scanned: tuple[float, float]
) -> None:
    """DuckDB's rows per kind of operator; the share of them from inputs every rank has whole is
    taken as that share of the stage's input rows (replicated scans, broadcasts)."""
    part, whole = scanned
    for node in walk(stage.root):
        if isinstance(node, ExchangeRead):
            rows = float(st.received.get(node.xid, 0))
            producer = by_sid.get(node.xid)
            if producer is not None and producer.output and producer.output.kind == ExchangeKind.BROADCAST:
                whole += rows
            else:
                part += rows
    share = whole / (part + whole) if part + whole > 0 else 0.0
    ops = st.operator_rows
    joins = float(sum(v for t, v in ops.items() if t.endswith("_JOIN") or t == "CROSS_PRODUCT"))
    aggs = float(ops.get("HASH_GROUP_BY", 0) + ops.get("PERFECT_HASH_GROUP_BY", 0))
    c.join_rows, c.join_whole = joins * (1 - share), joins * share
    c.agg_rows, c.agg_whole = aggs * (1 - share), aggs * share
    c.sort_rows = float(ops.get("ORDER_BY", 0))
    top = stage.root
    while isinstance(top, Project | Filter | Exchange):
        top = top.child
    c.partial_agg = isinstance(top, Aggregate) and top.phase == AggPhase.PARTIAL


def _row_width(stage: Stage) -> float:
    """Bytes per output row by the planner's estimate of the stage's exchange."""
    if stage.output is None:
        return 0.0
    rows, nbytes = stage.output.est
    return nbytes / rows if rows > 0 else 0.0


def measure_counts(
    stages: list[Stage], stats: list[StageStats], catalog: Catalog, size: int, result: tuple[int, int]
) -> list[Counts]:
    """Each (stage, rank)'s counts from a profiled run on ``size`` ranks; ``result``: the query's
    (rows, Arrow bytes), the final stage's output."""
    by_sid = {s.sid: s for s in stages}
    final_sid = max(s.sid for s in stats if s.rank == 0)
    out: list[Counts] = []
    for st in stats:
        stage = by_sid.get(st.sid)
        if stage is None:
            continue
        c = Counts(st.sid, st.rank, st.sid == final_sid, stage.output.kind.value if stage.output else "")
        _count_operators(c, stage, st, by_sid, _count_scans(c, stage, st, catalog, size))
        e = st.exchange
        if c.final:
            c.rows_out, c.bytes_out = float(result[0]), float(result[1])
        else:
            c.rows_out = float(e.rows_out)
            c.bytes_out = max(float(e.bytes_out), e.rows_out * _row_width(stage))
        c.bytes_wire = float(e.bytes_out)
        if c.out_kind == "gather":
            c.targets = 0 if st.rank == 0 else 1
        elif not c.final:
            c.targets = size - 1
        out.append(c)
    return out


# Predicting.


def predict_stage(c: Counts, k: Constants, cores: float) -> dict[str, float]:
    """Seconds per phase of one stage on one rank with ``cores`` effective cores."""
    operators = (
        (c.join_rows + c.join_whole) / k.join_rows_s
        + (c.agg_rows + c.agg_whole) / k.agg_rows_s
        + c.sort_rows / k.sort_rows_s
        + c.bytes_out / (k.arrow_gbps * GB)
    )
    scan = (c.scan_values + c.scan_whole_values) / k.scan_values_s + (
        c.scan_strings + c.scan_whole_strings
    ) / (k.scan_string_gbps * GB)
    part_gbps = k.partition4_gbps if c.targets < 4 else k.partition64_gbps
    routed = c.bytes_out / part_gbps if c.out_kind in ROUTED else 0.0
    one = min(1.0, cores)  # partitioning and encoding run on one thread of a rank
    pair = c.bytes_wire / c.targets if c.targets else 0.0
    messages = c.targets * max(1, math.ceil(pair / CHUNK_BYTES)) if c.bytes_wire else 0
    return {
        "scan": scan / cores,
        "operators": operators / cores,
        "partition": (routed + c.bytes_wire / k.ipc_gbps) / GB / one,
        "network": c.bytes_wire / (k.net_gbps * GB) + messages * k.latency_s,
        "pair_bytes": pair,
    }


@dataclass
class Prediction:
    """Seconds of one run: compute (scan + operators), partition and network are the max over ranks
    of their sums over the non-final stages (as phases.py measures them); ``stage_totals`` the
    slowest rank's sum of phases per non-final stage."""

    overhead: float
    final: float = 0.0
    scan: float = 0.0
    operators: float = 0.0
    partition: float = 0.0
    network: float = 0.0
    stage_totals: dict[int, float] = field(default_factory=dict)

    @property
    def compute(self) -> float:
        return self.scan + self.operators

    @property
    def total(self) -> float:
        return self.overhead + self.final + sum(self.stage_totals.values())

    def phases(self) -> dict[str, float]:
        names = ("overhead", "scan", "operators", "compute", "partition", "network", "final", "total")
        return {n: getattr(self, n) for n in names}


def predict(counts: list[Counts], k: Constants, size: int, cores: float, stages: int) -> Prediction:
    """One run on ``size`` ranks that share ``cores`` cores (this machine; each rank gets
    ``cores // size`` DuckDB threads, the driver's final stage all of them)."""
    rank_cores = min(float(max(1, int(cores) // size)), cores / size)
    pred = Prediction(k.overhead_s + k.overhead_per_stage_s * stages + k.overhead_per_rank_s * size)
    sums: dict[str, dict[int, float]] = {p: {} for p in ("scan", "operators", "partition", "network")}
    for c in counts:
        if c.final:
            p = predict_stage(c, k, cores)
            pred.final += p["scan"] + p["operators"]
            continue
        p = predict_stage(c, k, rank_cores)
        for name, ranks in sums.items():
            ranks[c.rank] = ranks.get(c.rank, 0.0) + p[name]
        mine = sum(p[n] for n in sums)
        pred.stage_totals[c.sid] = max(pred.stage_totals.get(c.sid, 0.0), mine)
    for name, ranks in sums.items():
        setattr(pred, name, max(ranks.values(), default=0.0))
    return pred


def counts_record(counts: list[Counts]) -> list[dict[str, object]]:
    return [asdict(c) for c in counts]


# Projecting to more nodes and data.

SHRINKING = ("scan_values", "scan_strings", "join_rows", "agg_rows", "sort_rows", "rows_out", "bytes_out")
WHOLE = ("scan_whole_values", "scan_whole_strings", "join_whole", "agg_whole")


def _stage_totals(counts: list[Counts]) -> dict[int, tuple[Counts, int]]:
    """Per stage: the ranks' counts summed (whole counts: averaged), and how many ranks ran it."""
    out: dict[int, tuple[Counts, int]] = {}
    for c in counts:
        if c.sid not in out:
            out[c.sid] = (replace(c, rank=0, bytes_wire=0.0, targets=0), 1)
            continue
        t, n = out[c.sid]
        for name in (*SHRINKING, *WHOLE):
            setattr(t, name, getattr(t, name) + getattr(c, name))
        out[c.sid] = (t, n + 1)
    for t, n in out.values():
        for name in WHOLE:
            setattr(t, name, getattr(t, name) / n)
    return out


def _per_node(t: Counts, ran_on: int, nodes: int, scale: float, spread: bool) -> Counts:
    """A stage's counts on one of ``nodes`` nodes at ``scale`` times the measured data; ``spread``:
    its whole inputs are too large to replicate at that scale, so they are split like the rest."""
    c = replace(t)
    share = scale / nodes if not t.final else scale
    for name in SHRINKING:
        setattr(c, name, getattr(t, name) * share)
    for name in WHOLE:
        setattr(c, name, getattr(t, name) * (share if spread else scale))
    if t.partial_agg:  # every node outputs its groups: the measured ranks' output, per node
        groups = scale if t.rows_out >= GROUPS_GROW * (t.agg_rows + t.agg_whole) else 1.0
        c.rows_out, c.bytes_out = t.rows_out / ran_on * groups, t.bytes_out / ran_on * groups
    return c


@dataclass
class Projection:
    nodes: int
    phases: dict[str, float]  # scan, operators, partition, network, final, overhead, total
    pair_bytes: float  # the largest per-pair message of a shuffle
    broadcast_bytes: float  # bytes each node receives by broadcasts
    replanned: list[int]  # stages whose whole inputs are shuffled instead at this scale


def _whole_bytes(t: Counts, broadcast_in: float) -> float:
    """Bytes a stage has whole on every rank: replicated scans (8 per value) and broadcasts."""
    return t.scan_whole_values * 8 + t.scan_whole_strings + broadcast_in


def project(
    counts: list[Counts],
    k: Constants,
    scale: float,
    nodes: int,
    cores: int,
    stages: int,
    broadcast_limit: float = BROADCAST_LIMIT,
) -> Projection:
    """One query on ``nodes`` nodes of ``cores`` cores (one rank each) at ``scale`` times the data
    the counts were measured on. A shuffle sends a node's (N-1)/N of its output to N-1 peers
    (per pair: output/N^2); a broadcast sends a node's output to N-1 peers, so each node receives
    almost all of it, however many nodes; a gather brings every node's output to the driver (a
    message from each), whose final stage then runs alone (merging partial aggregates: N nodes'
    groups). The plan is the measured one, except that inputs replicated or broadcast that outgrow
    ``broadcast_limit`` at this scale are hashed instead (as the planner would), their rows split
    over the nodes."""
    ph = dict.fromkeys(("scan", "operators", "partition", "network", "final"), 0.0)
    pair_max = bcast = gathered_bytes = merged_rows = 0.0
    totals = _stage_totals(counts)
    gathers = sum(t.out_kind == "gather" for t, _ in totals.values())
    broadcasts = sum(t.bytes_out for t, _ in totals.values() if t.out_kind == "broadcast")
    replanned = []
    for sid in sorted(totals):
        t, ran_on = totals[sid]
        spread = nodes > 1 and _whole_bytes(t, broadcasts) * scale > broadcast_limit
        if spread and (t.join_whole or t.agg_whole or t.scan_whole_values):
            replanned.append(sid)
        c = _per_node(t, ran_on, nodes, scale, spread)
        if c.final:
            if merged_rows and c.agg_rows:  # the driver merges every node's groups
                c.agg_rows = merged_rows
            p = predict_stage(c, k, float(cores))
            gather = gathered_bytes / (k.net_gbps * GB) + (nodes - 1) * k.latency_s * gathers
            ph["final"] += p["scan"] + p["operators"] + gather
            continue
        if c.out_kind == "broadcast" and t.bytes_out * scale > broadcast_limit:
            c.out_kind = "hash"
        if nodes > 1 and c.out_kind != "gather":
            c.targets = nodes - 1
            fan = nodes - 1 if c.out_kind == "broadcast" else (nodes - 1) / nodes
            c.bytes_wire = c.bytes_out * fan
            if c.out_kind == "broadcast":
                bcast += c.bytes_wire
        elif c.out_kind == "gather":
            gathered_bytes += c.bytes_out * (nodes - 1)
            merged_rows += c.rows_out * nodes if c.partial_agg else 0.0
        if spread:  # the replicated tables' rows, hashed to the nodes first
            c.bytes_wire += _whole_bytes(t, 0.0) * scale / nodes * (nodes - 1) / nodes
        if nodes > 1 and c.out_kind != "broadcast" and c.targets:
            pair_max = max(pair_max, c.bytes_wire / c.targets)
        p = predict_stage(c, k, float(cores))
        # Partitioning and encoding use every core of a node (one rank per core there).
        p["partition"] /= cores
        for name in ("scan", "operators", "partition", "network"):
            ph[name] += p[name]
    ph["overhead"] = k.overhead_s + k.overhead_per_stage_s * stages + k.overhead_per_rank_s * nodes
    ph["total"] = sum(ph.values())
    return Projection(nodes, ph, pair_max, bcast, replanned)
