"""What one rank may hold in memory, and where it spills.

The node's real limit is the smallest of: the cgroup limits on this process's own cgroup path and
its parents (v2 ``memory.max``, v1 ``memory.limit_in_bytes``), SLURM's allocation, physical memory.
A rank's share of it is split between DuckDB (which spills by itself past its ``memory_limit``),
received exchange data (spilled to local Arrow IPC files past its part, which is also bounded by the
memory the node has available when the rank starts) and data in flight; the
rest holds the Arrow batches of the stages running (and what DuckDB allocates beyond its limit),
which decides how many stages may run at once (plan/streaming.py).

Each rank spills into its own directory on node-local storage (SLURM's job scratch, ``$TMPDIR``,
else the system's temp directory; never the shared working directory), removed when the rank
closes. Directories of ranks that were killed are removed by the next rank that starts there.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import socket
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from duckflock.config import Config
from duckflock.errors import DuckflockError
from duckflock.exchange.shuffle import split_bytes
from duckflock.processes import pid_alive

# Of a rank's share: DuckDB's memory_limit, received exchange data, bytes in flight; the rest is for
# Python, Arrow buffers being split and sent, and DuckDB's own overshoot. DuckDB gets the most: a
# join that spills in DuckDB is slow, while received data spills to IPC files DuckDB streams from
# anyway. In a tight node a larger exchange part made a large join slower and its peak higher, since
# DuckDB then spilled what it would otherwise have held.
DUCKDB_PART = 0.7
EXCHANGE_PART = 0.1
INFLIGHT_PART = 0.05
# What one running stage holds outside DuckDB's limit: the batch DuckDB just gave (``batch_rows``
# rows of about BATCH_BYTES_PER_ROW: 55 for lineitem with l_comment), the batches waiting to be
# split by target together (exchange/shuffle.py's split_bytes) and, for each rank it sends to, the
# rows split off for that rank and not sent yet (up to a chunk). Where the room for stages
# is tight, chunks shrink (to MIN_CHUNK_BYTES at least: smaller chunks cost a little time per
# message) so that CHUNKS_IN_ROOM of them per target fit, and a small node then runs the stages of a
# streamed join at once instead of one at a time.
# However much room there is, chunks are at most SPLIT_BYTES / targets (but 1 MiB at least): what a
# rank holds for its targets, and what a streamed input holds of its senders' messages (a few per
# sender), would otherwise grow with the job's rank count; smaller chunks held less in the same
# time.
BATCH_BYTES_PER_ROW = 64
CHUNKS_IN_ROOM = 8
MIN_CHUNK_BYTES = 1 << 20
SPLIT_BYTES = 8 << 20
# Of the node's memory, what its ranks share (the rest: the system, page cache, other processes).
NODE_PART = 0.8
REST_PART = 1 - DUCKDB_PART - EXCHANGE_PART - INFLIGHT_PART
MAX_STAGES_AT_ONCE = 8
# A side broadcast for being cheaper to copy than the other side is to move may take up to one
# BROADCAST_SHARE-th of DuckDB's part: every rank builds a hash table of all of it.
BROADCAST_SHARE = 4
# Below this a DuckDB instance fails to pin the blocks a scan, a sort or a Parquet row group needs
# ("failed to pin block of size 256.0 KiB"): every instance gets at least this much.
DUCKDB_MIN_BYTES = 64 << 20
_PREFIX = "duckflock-"


@dataclass(frozen=True)
class Budget:
    rank_bytes: int  # everything this rank may hold
    duckdb_bytes: int  # memory_limit of each of the rank's DuckDB instances
    exchange_bytes: int  # received exchange data held in memory per stage before it spills
    inflight_bytes: int  # sent bytes not yet delivered before the producer waits
    stages_at_once: int = 1  # stages that may run at the same time (streaming, plan/streaming.py)
    chunk_bytes: int = 4 << 20  # rows split off for one target are sent once they reach this

    @classmethod
    def of_rank(cls, config: Config, ranks_on_node: int, ranks: int, held_bytes: int | None = None) -> Budget:
        """``held_bytes``: what the rank already holds (default: its process's anonymous memory;
        ranks that are threads of one process each hold their share of it)."""
        total = rank_share_bytes(config, ranks_on_node)
        # What the process already holds (Python, DuckDB, Arrow and MPI loaded) is spent.
        held = own_anon_bytes() if held_bytes is None else held_bytes
        free = max(total - held, total // 4)
        room = int(free * REST_PART)
        fits = min(room // (CHUNKS_IN_ROOM * ranks), SPLIT_BYTES // ranks)
        chunk = min(config.chunk_bytes, max(MIN_CHUNK_BYTES, fits))
        stage = BATCH_BYTES_PER_ROW * config.batch_rows + split_bytes(chunk, ranks) + ranks * chunk
        return cls(
            rank_bytes=total,
            duckdb_bytes=max(int(free * DUCKDB_PART), DUCKDB_MIN_BYTES),
            exchange_bytes=config.exchange_memory_bytes or exchange_share(free, ranks_on_node),
            inflight_bytes=max(min(config.max_inflight_bytes, int(free * INFLIGHT_PART)), 2 * chunk),
            stages_at_once=min(MAX_STAGES_AT_ONCE, max(1, room // stage)),
            chunk_bytes=chunk,
        )


def rank_share_bytes(config: Config, ranks_on_node: int) -> int:
    """Everything one rank may hold: the configured limit, or its share of the node's."""
    return config.memory_limit_bytes or int(node_memory_bytes() * NODE_PART / max(1, ranks_on_node))


def exchange_share(free_bytes: int, ranks_on_node: int) -> int:
    """Received exchange data a rank keeps in memory before it spills: its part of what the rank
    has free, and of the node's memory available now (other processes' use counts where no cgroup
    limit does; inside one, the limit is the tighter)."""
    available = int(min(available_bytes(), node_memory_bytes()) * NODE_PART / max(1, ranks_on_node))
    return int(min(free_bytes, available) * EXCHANGE_PART)


def with_derived_limits(config: Config, ranks_on_node: int) -> Config:
    """``config`` with the settings that follow from the rank's memory filled in, as the planner
    needs them. Only the node's limit counts, not what the process holds: ``duckflock explain``
    derives the same plan as the ranks that run it."""
    return with_share(config, rank_share_bytes(config, ranks_on_node))


def with_share(config: Config, share_bytes: int) -> Config:
    """``config`` with the planner's limits for ranks that may each hold ``share_bytes`` (the
    smallest share of any rank, where nodes differ): a broadcast side must fit every rank."""
    if config.broadcast_max_bytes:
        return config
    duckdb_part = int(share_bytes * DUCKDB_PART)
    return replace(config, broadcast_max_bytes=duckdb_part // BROADCAST_SHARE)


def own_anon_bytes() -> int:
    """This process's anonymous resident memory (0 where /proc is missing)."""
    return _proc_bytes("/proc/self/status", "RssAnon:") or 0


def available_bytes() -> int:
    """The kernel's estimate of memory available to new allocations without swapping (MemAvailable:
    free memory plus the page cache it can drop); physical memory where /proc is missing."""
    found = _proc_bytes("/proc/meminfo", "MemAvailable:")
    return found if found is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _proc_bytes(path: str, field: str) -> int | None:
    """A ``field: N kB`` line of a /proc file, in bytes (None where it is missing)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return None


def node_memory_bytes() -> int:
    """Memory this node's processes may use: the tightest of cgroup, SLURM and physical memory."""
    limits = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")]
    limits += _cgroup_limits()
    slurm = _slurm_bytes()
    if slurm:
        limits.append(slurm)
    return min(limits)


def _cgroup_limits(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> list[int]:
    """The memory limits on this process's cgroup and its ancestors (v2 unified or v1 memory)."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and controllers == "":
            base, name = Path(root), "memory.max"
        elif "memory" in controllers.split(","):
            base, name = Path(root) / "memory", "memory.limit_in_bytes"
        else:
            continue
        rel = Path(path.lstrip("/"))
        for d in [rel, *rel.parents]:
            value = _read_limit(base / d / name)
            if value is not None:
                found.append(value)
    return found


def _read_limit(path: Path) -> int | None:
    try:
        raw = path.read_text().strip()
    except OSError:
        return None
    if raw == "max" or not raw.isdigit() or int(raw) >= 1 << 60:  # v1 writes "no limit" as ~2^63
        return None
    return int(raw)


def _slurm_bytes() -> int:
    """SLURM's memory allocation for this node (MB in the environment), 0 when not under SLURM."""
    per_node = os.environ.get("SLURM_MEM_PER_NODE", "")
    if per_node.isdigit():
        return int(per_node) << 20
    per_cpu = os.environ.get("SLURM_MEM_PER_CPU", "")
    cpus = os.environ.get("SLURM_CPUS_ON_NODE", "")
    if per_cpu.isdigit() and cpus.isdigit():
        return int(per_cpu) * int(cpus) << 20
    return 0


def spill_base(config: Config) -> Path:
    """Node-local storage for spill files: the configured directory, SLURM's job scratch, $TMPDIR."""
    for candidate in (config.temp_dir, os.environ.get("SLURM_TMPDIR", ""), tempfile.gettempdir()):
        if candidate:
            return Path(candidate)
    return Path("/tmp")


def make_spill_dir(config: Config, rank: int) -> Path:
    """This rank's own spill directory, after removing those left by ranks that were killed."""
    base = spill_base(config)
    try:
        base.mkdir(parents=True, exist_ok=True)
        _remove_orphans(base)
        path = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-r{rank}-{_host()}-", dir=base))
    except OSError as e:
        raise DuckflockError(f"cannot make a spill directory in {base} (temp_dir): {e.strerror}") from None
    atexit.register(remove_spill_dir, path)  # also when the rank ends without closing its runtime
    return path


def remove_spill_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def remove_orphaned_spill_dirs() -> None:
    """The spill directories (in the configured place) of this host's processes that are gone."""
    base = spill_base(Config.from_env())
    if base.is_dir():
        _remove_orphans(base)


def _remove_orphans(base: Path) -> None:
    """Spill directories of this host whose process is gone (killed before it could clean up).
    Another host's, in a temp_dir the nodes share, may belong to a live process there."""
    # duckflock-<pid>-r<rank>-<host>-<mkdtemp's suffix, no dash>; the host may hold dashes.
    remove_orphans(base, f"{_PREFIX}*-r*-*", rf"{_PREFIX}(?P<pid>\d+)-r\d+-(?P<host>.+)-[^-]+")


def remove_orphans(base: Path, glob: str, name: str) -> None:
    """Remove the directories of ``base`` matching ``glob`` whose ``name`` (a regular expression
    with a ``pid`` group, and a ``host`` group where several hosts share ``base``) names a process
    of this host that is gone."""
    for d in base.glob(glob):
        named = re.fullmatch(name, d.name)
        if named is None or pid_alive(int(named["pid"])):
            continue
        if "host" in named.groupdict() and named["host"] != _host():
            continue
        shutil.rmtree(d, ignore_errors=True)


def _host() -> str:
    return socket.gethostname().replace("/", "_") or "host"
