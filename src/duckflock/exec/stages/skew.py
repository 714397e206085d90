"""Heavy-hitter keys of a join found at run time, and the routing of their rows (see plan/skew.py).

The stage producing the spreading side holds its first rows (up to ``SAMPLE_ROWS`` per rank), counts
the hashes of their join keys, and the ranks agree through one allgather on the keys whose estimated
share of all rows exceeds 1/(2·ranks). A key is identified by the same DuckDB hash of its cast values
that places it, so both sides name it alike whatever its type (NULL included); two keys sharing a
hash are just treated alike on both sides, which stays exact. The spreading side keeps the rows of a
hot key on the rank producing them where every rank's sample holds about the same share of it (the
key is spread already: moving its rows would only cost the network), and deals them round-robin over
the ranks otherwise (a table placed by the key holds it on one rank); the replicating side, cut into
a later stage, sends its rows of those keys to every rank. Without hot keys both sides are hashed as
usual.

Rows kept where they are produced need not leave DuckDB at all when the spreading stage only scans,
filters and computes (``plan/skew.rescannable``): its query restarts without them, and the join's
stage reads them again itself, beside the rows it receives. They then cost neither an Arrow export,
a split nor memory between the stages: with half of a table's rows on one key, that is half of
every rank's rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from duckflock.arrays import arrow_array, numpy_view
from duckflock.catalog.partitioning import Hashed, Ranged
from duckflock.exchange.kinds import ExchangeKind
from duckflock.exec.resources.runtime import Runtime
from duckflock.plan.kinds import SkewRole
from duckflock.plan.sql_text import KEY_HASH_COLUMN
from duckflock.plan.stages import ExchangeSpec

SAMPLE_ROWS = 64 * 1024
# A hot key stays where it is produced when each rank's sampled share of it is at least this part
# of the largest rank's share.
EVEN_SHARE = 0.5


@dataclass
class HotKeys:
    """One query's hot join keys on this rank, as the stages spreading them found them."""

    keys: dict[str, np.ndarray] = field(default_factory=dict)  # by the pair's ``skew_group``
    # By spreading exchange: SQL of the rows of its hot keys this rank kept in DuckDB, for the stage
    # reading the exchange to read beside what it receives.
    kept: dict[int, str] = field(default_factory=dict)


# Restarts a spreading stage's query without the rows of the given key hashes: its new reader and
# the SQL of the rows left out.
Restart = Callable[[np.ndarray], tuple[pa.RecordBatchReader, str]]


def applies(spec: ExchangeSpec) -> bool:
    """Whether the stage routes hot keys' rows: a marked hash or range exchange that sends rows (its
    query then carries each row's key hash, ``sql_text.with_key_hash``, before the target column)."""
    hashed = spec.kind is ExchangeKind.HASH and isinstance(spec.target, Hashed)
    ranged = spec.kind is ExchangeKind.RANGE and isinstance(spec.target, Ranged)
    return spec.skew is not None and (hashed or ranged) and not spec.local


def route(
    rt: Runtime,
    qid: int,
    spec: ExchangeSpec,
    reader: pa.RecordBatchReader,
    hot: HotKeys,
    note: Callable[[str], None],
    restart: Restart | None = None,
) -> pa.RecordBatchReader:
    """``reader``'s batches (key hash and target last) with the targets of hot keys' rows changed
    and the key hash dropped. On the spreading side a collective: every rank agrees on the hot keys;
    with ``restart``, the rows of the keys kept where they are produced stay in DuckDB. What was
    done goes to ``note`` once the batches are exhausted (for the profile)."""
    schema = reader.schema.remove(reader.schema.get_field_index(KEY_HASH_COLUMN))
    if spec.skew is SkewRole.SPREAD:
        held, keys, local = _detect(rt, qid, reader)
        hot.keys[spec.skew_group] = keys
        in_duckdb = 0
        if len(local) and restart is not None:
            reader.close()  # the rows read so far come again, but for those of ``local``
            held = []
            reader, hot.kept[spec.xid] = restart(local)
            in_duckdb, local = len(local), local[:0]  # their rows no longer come: nothing to look for
        batches = _spread(held, reader, keys, local, rt.rank, rt.size, spec.xid, in_duckdb, note)
    else:
        # No entry when the spreading stage did not run here: then it sent nothing either.
        keys = hot.keys.get(spec.skew_group, np.empty(0, np.uint64))
        batches = _replicate(reader, keys, rt.size, spec.xid, note)
    return pa.RecordBatchReader.from_batches(schema, batches)


def _detect(
    rt: Runtime, qid: int, reader: pa.RecordBatchReader
) -> tuple[list[pa.RecordBatch], np.ndarray, np.ndarray]:
    """This rank's first batches (held, to be sent after), the hot key hashes all ranks agree on,
    and those of them every rank produces about evenly (kept where they are)."""
    held: list[pa.RecordBatch] = []
    rows = 0
    while rows < SAMPLE_ROWS:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        held.append(batch)
        rows += batch.num_rows
    full = rows >= SAMPLE_ROWS
    hashes = np.concatenate([_hashes(b) for b in held]) if held else np.empty(0, np.uint64)
    values, counts = np.unique(hashes, return_counts=True)
    # Only candidates travel: a key over 1/(2·ranks) of all rows is over 1/(4·ranks) somewhere.
    keep = counts > rows / (4 * rt.size)
    gathered = rt.mux.allgather(qid, (rows, full, values[keep], counts[keep]))
    total = sum(g[0] for g in gathered)
    if rt.size == 1 or total == 0 or not (any(g[1] for g in gathered) or total >= rt.config.skew_min_rows):
        return held, np.empty(0, np.uint64), np.empty(0, np.uint64)
    merged: dict[int, int] = {}
    for _, _, v, c in gathered:
        for key, n in zip(v.tolist(), c.tolist(), strict=True):
            merged[key] = merged.get(key, 0) + n
    hot = sorted(k for k, n in merged.items() if n > total / (2 * rt.size))
    even = [k for k in hot if _produced_evenly(k, gathered)]
    return held, np.array(hot, dtype=np.uint64), np.array(even, dtype=np.uint64)


def _produced_evenly(key: int, gathered: list) -> bool:
    """Whether every rank's sample holds about the same share of ``key`` (a rank that did not
    report it as a candidate holds too little of it)."""
    shares = []
    for rows, _, values, counts in gathered:
        found = dict(zip(values.tolist(), counts.tolist(), strict=True))
        shares.append(found.get(key, 0) / rows if rows else 0.0)
    return min(shares) >= EVEN_SHARE * max(shares)


def _hashes(batch: pa.RecordBatch) -> np.ndarray:
    return numpy_view(batch.column(batch.num_columns - 2)).astype(np.uint64, copy=False)


def _targets(batch: pa.RecordBatch) -> np.ndarray:
    return numpy_view(batch.column(batch.num_columns - 1)).astype(np.uint16)


def _with_targets(batch: pa.RecordBatch, targets: np.ndarray) -> pa.RecordBatch:
    """The data columns of ``batch`` followed by ``targets``."""
    data = batch.drop_columns([KEY_HASH_COLUMN, batch.schema.names[-1]])
    return data.append_column(
        batch.schema.field(batch.num_columns - 1), arrow_array(targets.astype(np.uint16, copy=False))
    )


def _batches(held: list[pa.RecordBatch], reader: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
    held.reverse()
    while held:
        yield held.pop()  # let go of each held batch as it is handed out
    yield from reader


def _spread(
    held: list[pa.RecordBatch],
    reader: pa.RecordBatchReader,
    keys: np.ndarray,
    local: np.ndarray,
    rank: int,
    size: int,
    xid: int,
    in_duckdb: int,
    note: Callable[[str], None],
) -> Iterator[pa.RecordBatch]:
    """Rows of hot keys in ``local`` kept on this rank, the others dealt round-robin, starting at
    this rank so the ranks' deals interleave. ``in_duckdb``: how many hot keys' rows never come here,
    read again by the join's stage."""
    next_target = rank
    spread = kept = 0
    for batch in _batches(held, reader):
        targets = _targets(batch)
        if len(keys):
            hashes = _hashes(batch)
            hot = np.isin(hashes, keys)
            if len(local):
                here = np.isin(hashes, local)
                targets[here] = rank
                kept += int(here.sum())
                hot &= ~here
            n = int(hot.sum())
            targets[hot] = (next_target + np.arange(n)) % size
            next_target = (next_target + n) % size
            spread += n
        yield _with_targets(batch, targets)
    left_in = f"; the rows of {in_duckdb} of them left in DuckDB, read again by the join" if in_duckdb else ""
    note(
        f"x{xid}: {len(keys)} hot join keys, {spread + kept:,} rows of them spread over all ranks "
        f"({kept:,} kept where produced){left_in}"
        if len(keys)
        else f"x{xid}: no hot join keys"
    )


def _replicate(
    reader: pa.RecordBatchReader, keys: np.ndarray, size: int, xid: int, note: Callable[[str], None]
) -> Iterator[pa.RecordBatch]:
    """Rows of hot keys once for every rank, the others to their hashed target."""
    copied = 0
    for batch in reader:
        targets = _targets(batch)
        hot = np.isin(_hashes(batch), keys) if len(keys) else None
        if hot is None or not hot.any():
            yield _with_targets(batch, targets)
            continue
        yield _with_targets(batch.filter(arrow_array(~hot)), targets[~hot])
        rows = batch.filter(arrow_array(hot))
        copied += rows.num_rows
        for t in range(size):
            yield _with_targets(rows, np.full(rows.num_rows, t, np.uint16))
    note(
        f"x{xid}: {len(keys)} hot join keys, {copied:,} rows of them sent to every rank"
        if len(keys)
        else f"x{xid}: no hot join keys"
    )
