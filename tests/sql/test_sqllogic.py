"""Every tests/sql/*.test file on 1-4 ranks, threads and MPI, broadcasts on and forced off: each query
must give single-process DuckDB's answer, each refusal must name its construct, and only queries
under a ``driver`` line may run on the driver (duckflock.testing.sqllogic).

DUCKFLOCK_SLT_FULL=1 runs every file on every combination; by default each file runs on a spread
of them that still covers every transport, 1-4 ranks, and broadcasts/gathered sorts on and off."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

import duckflock
from duckflock.testing.sqllogic import NO_BROADCAST, counts, parse, run

FILES = sorted(Path(__file__).parent.glob("*.test"))
# How ranks run: threads of this process; an MPI job of one rank per process; an MPI job of two
# ranks per process (threads within, MPI between them).
TRANSPORTS = {
    "threads": ("threads", {}),
    "mpi": ("mpi", {"ranks_per_process": 1}),
    "mpi2": ("mpi", {"ranks_per_process": 2}),
    # Rank processes that share only a directory (transport/storage.py); each job has its own
    # directory under it, removed when the session ends.
    "storage": ("storage", {"exchange_uri": tempfile.gettempdir()}),
}
# (transport, ranks, config)
FULL = [(t, r, c) for t in ("threads", "mpi") for r in (1, 2, 3, 4) for c in ("default", "off")]
FULL += [("mpi2", r, c) for r in (2, 4) for c in ("default", "off")]
QUICK = [
    ("threads", 1, "default"),
    ("threads", 2, "off"),
    ("threads", 3, "default"),
    ("mpi", 3, "off"),
    ("mpi2", 4, "off"),
]
# The generated files (hundreds of queries each) run on one or two combinations, to keep `make
# test` short: what they vary is the SQL, which the planner handles alike on every transport (the
# hand-written files cover the transports); 2 and 3 ranks, broadcasts on and off.
SPREAD = [("threads", 2, "default"), ("mpi", 3, "off")]
WIDE = {
    "aggregates": [("threads", 3, "off")],
    "combinations": [("threads", 2, "off")],
    "scalars": [("threads", 3, "off")],
    "windows": [("threads", 3, "default")],
    "join_matrix": [("threads", 2, "default"), ("threads", 3, "off")],
    "type_matrix": SPREAD,
}

# The edit loop's one combination per file where the file runs on it (else its first): two ranks,
# threads, broadcasts forced off (so joins and aggregates shuffle). The generated files (WIDE) run
# only in `make test`: they take minutes, and the hand-written files cover the same shapes.
FAST = ("threads", 2, "off")

# The storage transport on the files whose queries exchange the most shapes of data.
STORAGE = {"joins": [("storage", 2, "off")], "subqueries": [("storage", 3, "default")]}


def _cases() -> list:
    if os.environ.get("DUCKFLOCK_SLT_FULL"):
        full = [(p, c) for p in FILES for c in FULL]
        full += [(p, ("storage", r, c)) for p in FILES for r in (2, 3) for c in ("default", "off")]
        return [pytest.param(p, *c, id=f"{p.stem}-{c}") for p, c in full]
    cases = []
    for p in FILES:
        combos = [*WIDE.get(p.stem, QUICK), *STORAGE.get(p.stem, [])]
        # `make test-fast` runs each hand-written file once
        fast = None if p.stem in WIDE else FAST if FAST in combos else combos[0]
        cases += [
            pytest.param(p, *c, id=f"{p.stem}-{c}", marks=() if c == fast else pytest.mark.slow)
            for c in combos
        ]
    return cases


@pytest.mark.parametrize(("path", "transport", "ranks", "config"), _cases())
def test_sql_file(path, transport, ranks, config):
    how, placement = TRANSPORTS[transport]
    cfg = {**(NO_BROADCAST if config == "off" else {}), **placement}
    outcomes = run(
        parse(path),
        lambda d, extra: duckflock.connect(d, ranks=ranks, transport=how, config={**cfg, **extra}),
    )
    bad = [o for o in outcomes if o.status in ("wrong", "failed")]
    assert not bad, "\n".join(
        f"{path.name}:{o.record.line}: {o.status}: {o.record.sql}\n    {o.detail}" for o in bad
    )


def test_hash_partitioned_table_without_files(tmp_path):
    """A table loaded with zero rows has partitions but no files: queries see an empty table."""
    from duckflock.catalog import Catalog, PartitionInfo, TableInfo

    parts = tuple(PartitionInfo((), 0) for _ in range(3))
    info = TableInfo("z", "parquet", (("k", "INTEGER"), ("s", "VARCHAR")), parts, kind="hash", keys=("k",))
    catalog = Catalog.open_or_create(tmp_path)
    catalog.put(info)
    catalog.save()
    with duckflock.connect(str(tmp_path), ranks=2, transport="threads", config=NO_BROADCAST) as db:
        assert db.sql("SELECT count(*) AS n, max(s) AS m FROM z").fetchall() == [(0, None)]
        assert db.sql("SELECT a.k FROM z a JOIN z b ON a.k = b.k").fetchall() == []
        assert db.sql("SELECT k, count(*) FROM z GROUP BY k").fetchall() == []


def test_a_query_runs_on_the_driver_only_where_a_driver_line_says_so(tmp_path):
    """The runner's fallback is off except where declared: an undeclared fallback fails, and so
    does a driver line over a query that runs distributed; --counts groups them by construct."""
    path = tmp_path / "driver.test"
    path.write_text(
        "statement ok\nCREATE TABLE t AS SELECT i AS k FROM range(10) r(i)\n\n"
        "driver POSITIONAL\nquery\nSELECT a.k FROM t a POSITIONAL JOIN t b\n\n"
        "query\nSELECT a.k FROM t a POSITIONAL JOIN t b\n\n"
        "driver POSITIONAL\nquery\nSELECT k FROM t\n\n"
        "driver NATURAL\nquery\nSELECT a.k FROM t a POSITIONAL JOIN t b\n\n"
        "query\nSELECT count(*) FROM t\n"
    )
    test = parse(path)
    assert [r.driver for r in test.checks] == ["POSITIONAL", None, "POSITIONAL", "NATURAL", None]
    outcomes = run(test, lambda d, extra: duckflock.connect(d, ranks=2, transport="threads", config=extra))
    assert [(o.status, o.how) for o in outcomes] == [
        ("correct", "driver"),
        ("failed", "driver"),
        ("failed", "distributed"),
        ("failed", "driver"),
        ("correct", "distributed"),
    ]
    assert "without a driver line" in outcomes[1].detail and "remove it" in outcomes[2].detail
    text = counts([(path, o) for o in outcomes])
    assert text.splitlines()[0] == (
        "5 records: distributed 2, driver 3, refused 0, internal 0, error 0 (40.0% of 5 valid)"
    )
    assert "on the driver, declared (2):\n        2  POSITIONAL JOIN" in text
