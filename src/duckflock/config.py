"""Engine settings: one frozen dataclass, fed from the environment or by the caller."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class Config:
    # Each field's `#:` lines say what it sets (docs/configuration.md's table is rendered from them:
    # python -m duckflock.config_doc); plain comments below them say why.

    #: A join side estimated below this many bytes is broadcast instead of shuffled (measured before
    #: it is sent, and hashed instead when larger); 0 turns broadcasts off wherever a shuffle gives
    #: the same rows.
    broadcast_threshold_bytes: int = 16 * 1024 * 1024
    #: A larger side, up to this many bytes, is broadcast too where its copies on all ranks add up to
    #: at most half the other side, which would move instead. 0: a quarter of DuckDB's part of a
    #: rank's share of the node's limit (the smallest share of any rank where nodes differ, under MPI
    #: and with workers; `explain` derives it as if all `--ranks` ran on this node); -1: only sides
    #: under the threshold.
    # HyPer's broadcast-vs-hash choice by bytes moved (plan/distribute.py). The side is measured
    # before it is replicated, against this bound. The default, set by the runtime from the node's
    # limit only (exec/resources/budget.py, so explain derives it alike), lets the copy's hash
    # table fit on every rank.
    broadcast_max_bytes: int = 0
    #: A stage that reads tables only runs once for all the ranks of a process, not once per rank,
    #: when the copies that saves (one per other rank of the process, of the scanned columns of
    #: tables read whole) hold this many bytes; a stage that only scans and filters partitioned
    #: tables, when it scans this many bytes in a process of more ranks than cores.
    # exec/resources/fused.py. Below, a copy per rank costs less than one DuckDB with the process's
    # threads over all its partitions (whose hash tables and buffers then sit in one place, at
    # once), and running small stages once saves no time. Above, the copies it saves dominate the
    # process's memory.
    fuse_min_bytes: int = 16 * 1024 * 1024
    #: Rows per record batch pulled from DuckDB.
    # Enough to amortise Python's per-batch work, few enough that a batch and its pieces split by
    # target stay small: larger batches raised the ranks' peak memory and saved no time.
    batch_rows: int = 64 * 1024
    #: Bytes buffered per target before a chunk is serialized and sent (at most: a rank with little
    #: room outside DuckDB, or with more than 2 targets, takes smaller chunks, 1 MiB at least).
    # exec/resources/budget.py. Smaller chunks hold a little less memory but cost time per message
    # on large exchanges.
    chunk_bytes: int = 4 * 1024 * 1024
    #: Bytes a rank may have in flight (queued or sending) before the producer waits: back-pressure.
    max_inflight_bytes: int = 64 * 1024 * 1024
    #: A full `ORDER BY` (no `LIMIT`) over more than this many estimated bytes is sorted in
    #: parallel: range-partitioned by sampled splitters, sorted per rank, concatenated in order on
    #: the driver. Below it the rows are gathered and the driver sorts them.
    # One data movement instead of two: below the threshold, sampling splitters and moving the rows
    # again costs more than the driver's sort.
    range_sort_threshold_bytes: int = 256 * 1024 * 1024
    #: Below the range-sort threshold, where all ranks are threads of the driver's process: true
    #: merges the ranks' sorted runs on the driver; false sorts the gathered rows with the driver's
    #: DuckDB on every core of the node.
    # Where ranks run in several processes (maybe on several nodes, whose driver would sort
    # everything alone), every rank sorts its rows and the driver merges the sorted runs. In one
    # process the driver's DuckDB, with every core of the node, sorts the gathered rows faster than
    # the ranks sort and the driver merges.
    merge_sort_in_process: bool = False
    #: Arrow IPC body compression on the wire: `none`, `lz4` or `zstd`.
    compression: str = "none"
    #: DuckDB threads per rank; 0: this rank's fair share of the node's cores.
    threads: int = 0
    #: In an MPI job of one rank per process, pin each rank's process to its own core (the node's
    #: ranks in turn over the cores the job may use), as `mpiexec -bind-to core` would.
    # For measuring parallel efficiency against DuckDB on one core (`duckflock bench scaling`).
    pin_cores: bool = False
    #: Ranks in one process, as threads. A job that duckflock starts on this machine puts this many
    #: ranks in each process (0: all in one); inside an MPI job (`srun`, your own `mpiexec`) each of
    #: its processes runs this many ranks (0: one).
    # They share its interpreter and libraries (loaded once per process, before any query) and hand
    # each other their exchanges in memory, so a job's peak memory is lower than with a process per
    # rank; MPI links processes.
    ranks_per_process: int = 0
    #: Memory one rank may hold, in bytes: DuckDB's `memory_limit` (70%), received exchange data
    #: (10%) and data in flight (5%) are parts of it. 0: this rank's share of the node's limit (its
    #: cgroup, SLURM allocation or physical memory).
    # exec/resources/budget.py.
    memory_limit_bytes: int = 0
    #: Received exchange data a stage holds in memory before the rest spills to local Arrow IPC
    #: files (which DuckDB scans memory-mapped); 0: a fixed part of the rank's memory.
    exchange_memory_bytes: int = 0
    #: Node-local directory under which each rank spills (DuckDB and exchanges) into a directory of
    #: its own, removed when the rank ends (a killed rank's by the next run); empty: SLURM's job
    #: scratch, else `$TMPDIR`, else `/tmp`.
    temp_dir: str = ""
    #: The most bytes a rank may spill; 0 leaves DuckDB's default (90% of the free disk space).
    max_temp_bytes: int = 0
    #: Every rank can read every file of the data directory (shared file system): small tables are
    #: then read in full by each rank instead of being broadcast over the network.
    shared_storage: bool = True
    #: Seconds slept between polls of a transport with transfers in progress.
    # Transfers advance only while polled, but spinning would take the core from DuckDB.
    busy_poll_s: float = 0.00005
    #: Python's GIL switch interval in processes that run ranks (the caller's own when ranks are
    #: threads); 0 leaves the process's setting alone.
    # Short, so the multiplexer thread gets the GIL promptly while DuckDB's result batches are split
    # in another thread.
    gil_switch_interval_s: float = 0.0005
    #: Seconds without any sign of life from a peer before a query fails (Flight and storage
    #: transports).
    peer_timeout_s: float = 30.0
    #: Where ranks of the storage transport exchange (a directory, `file://` or `s3://` URI): every
    #: message is an object under `<exchange_uri>/<job>/`.
    # transport/storage.py.
    exchange_uri: str = ""
    #: DuckDB may read only the data directory (workers serving remote callers).
    restrict_to_data_dir: bool = False
    #: The DuckDB `TimeZone` of every rank, by which a `TIMESTAMPTZ` renders, truncates, casts and
    #: hashes; empty: the caller's (Flight workers), rank 0's (MPI; ranks started as threads share
    #: the caller's process).
    # Ranks on hosts set to other zones would otherwise answer differently.
    time_zone: str = ""
    #: A query duckflock cannot distribute (recursive CTEs, `POSITIONAL` joins, `UNNEST`, ...) is
    #: answered by DuckDB on the driver when the tables it reads hold at most this many bytes
    #: (estimated from the catalog); above it (always, at -1) it is refused, naming the construct.
    driver_fallback_bytes: int = 256 * 1024 * 1024
    #: A join of two hashed sides deals the rows of heavy-hitter keys of its bigger side over all
    #: ranks and replicates the other side's rows of those keys.
    # plan/skew.py. Such a join's output is then not partitioned by its keys.
    skew_joins: bool = True
    #: The fewest rows (estimated by the planner, then counted at run time) of the bigger side of a
    #: join whose heavy-hitter keys `skew_joins` spreads.
    skew_min_rows: int = 100_000
    #: A stage may read an exchange as it arrives, running alongside the stages from its producer
    #: on, when the rank's memory leaves room for them.
    # plan/streaming.py, exec/resources/budget.py.
    stream_inputs: bool = True
    #: Only an exchange the planner estimates to bring a rank at least this many bytes is streamed.
    # A smaller one would wait in memory whole anyway (a stream holds up to 32 MiB,
    # exchange/stream.py).
    stream_min_bytes: int = 32 << 20
    #: A stage whose rows received into a table's partitioning hold more than this many bytes on a
    #: rank runs once per group of the rank's partitions, each group's rows about this size. 0:
    #: DuckDB's `memory_limit` on the rank; -1: every stage runs once.
    # So that DuckDB's hash tables fit its memory instead of spilling (exec/stages/partition_runs.py).
    partition_run_bytes: int = 0
    #: `duckflock serve`: an unordered result (no `ORDER BY`, no `LIMIT`) of at least this many
    #: bytes comes from an endpoint per rank, each rank serving its part from its temp directory;
    #: a smaller one from the server's own endpoint. -1: always from the server's.
    # flightsql/parts.py. Below, a client's extra connections (one per rank, each logging in) cost
    # more than reading through one endpoint saves.
    serve_parts_min_bytes: int = 64 << 20
    #: `duckflock serve`: seconds a rank keeps its part of a result that no client fetches to its end
    #: before deleting it.
    serve_part_timeout_s: float = 600.0

    @classmethod
    def from_env(cls, **overrides: Any) -> Config:
        """Read DUCKFLOCK_<FIELD> variables, then apply explicit overrides."""
        values: dict[str, Any] = {}  # each converted to its field's type below
        for f in fields(cls):
            raw = os.environ.get(f"DUCKFLOCK_{f.name.upper()}")
            if raw is None:
                continue
            try:
                if f.type in ("bool", bool):
                    values[f.name] = raw.lower() in ("1", "true", "yes", "on")
                elif f.type in ("int", int):
                    values[f.name] = int(raw)
                elif f.type in ("float", float):
                    values[f.name] = float(raw)
                else:
                    values[f.name] = raw
            except ValueError:
                from duckflock.errors import DuckflockError

                kind = "a whole number" if f.type in ("int", int) else "a number"
                raise DuckflockError(f"DUCKFLOCK_{f.name.upper()}={raw!r} is not {kind}") from None
        config = replace(cls(**values), **{k: v for k, v in overrides.items() if v is not None})
        _check_values(config)
        if config.time_zone:  # an unknown one fails here, once, not in every rank as it starts
            from duckflock.local_duckdb import check_time_zone

            check_time_zone(config.time_zone)
        return config


_COMPRESSIONS = ("none", "lz4", "zstd")
# Fields that must be positive, and those that may be 0 (its meaning above) but not negative.
_POSITIVE = ("batch_rows", "chunk_bytes", "max_inflight_bytes", "peer_timeout_s", "serve_part_timeout_s")
_NOT_NEGATIVE = (
    "broadcast_threshold_bytes", "range_sort_threshold_bytes", "threads", "memory_limit_bytes",
    "exchange_memory_bytes", "max_temp_bytes", "busy_poll_s", "gil_switch_interval_s",
    "skew_min_rows", "stream_min_bytes", "ranks_per_process", "fuse_min_bytes",
)  # fmt: skip


def _check_values(config: Config) -> None:
    """One clear message at the start for a value no rank could use (else each rank failed on it)."""
    from duckflock.errors import DuckflockError

    if config.compression not in _COMPRESSIONS:
        raise DuckflockError(
            f"compression must be one of {', '.join(_COMPRESSIONS)}, not {config.compression!r}"
        )
    for name in _POSITIVE:
        if getattr(config, name) <= 0:
            raise DuckflockError(f"{name} must be positive, not {getattr(config, name)!r}")
    for name in _NOT_NEGATIVE:
        if getattr(config, name) < 0:
            raise DuckflockError(f"{name} must not be negative, not {getattr(config, name)!r}")
