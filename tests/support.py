"""Shared test helpers: building small partitioned tables, the single-process DuckDB oracle, result
comparison, and running queries on real MPI ranks."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from duckflock.exec.hosting.launch import mpiexec_argv
from duckflock.exec.stages.stage import STAGE_GATE_ENV
from duckflock.testing.compare import difference
from duckflock.testing.tables import make_table, oracle

BOUND_S = 90  # a hang becomes a failure long before CI's limit

__all__ = ["assert_same", "make_table", "one_core", "oracle", "read_parts", "run_on_ranks"]

RUNNER = Path(__file__).parent / "distributed" / "run_queries.py"


def assert_same(got: pa.Table, expected: pa.Table, order_by: list[str] | None = None) -> None:
    """Equal as multisets (floats within 1e-9 relative; everything else exact), same column names and
    types; with ``order_by`` the sequence of those columns must match too."""
    problem = difference(got, expected, order_by)
    assert problem is None, problem


@contextmanager
def one_core() -> Iterator[None]:
    """This process (and the ranks it starts) on one core: every process of ranks has more ranks
    than cores, on any machine."""
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, cores)


def read_parts(directory: Path) -> pa.Table:
    """The part files of a result directory in name order, as a reader of it would take them."""
    assert (directory / "_SUCCESS").exists()
    parts = sorted(directory.glob("part-*.parquet"))
    assert parts and not list(directory.glob(".*")), "temporary files left"
    return pa.concat_tables([pq.read_table(p) for p in parts])


def run_on_ranks(
    data: Path,
    ranks: int,
    queries: list[str],
    out: Path,
    env: dict[str, str] | None = None,
    timeout: float = 240,
) -> list[pa.Table | str]:
    """Run queries in one SPMD job of ``ranks`` MPI processes; each result is a table or an error text."""
    out.mkdir(parents=True, exist_ok=True)
    spec = out / "queries.json"
    spec.write_text(json.dumps(queries))
    argv = mpiexec_argv(ranks, [str(RUNNER), str(data), str(spec), str(out)])
    proc = subprocess.run(
        argv, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results: list[pa.Table | str] = []
    for i in range(len(queries)):
        err = out / f"{i}.err"
        if err.exists():
            results.append(err.read_text())
        else:
            with pa.memory_map(str(out / f"{i}.arrow")) as src:
                results.append(pa.ipc.open_file(src).read_all())
    return results


def stage_gate(tmp_path: Path, monkeypatch) -> Path:
    """A closed stage gate (exec/stages/stage.py's test hook) for the ranks this test runs from now on: in
    this process, and in the processes it starts. Each rank announces its stages there and holds
    while ``hold`` exists."""
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "hold").touch()
    monkeypatch.setenv(STAGE_GATE_ENV, str(gate))
    return gate


def rank_at_gate(gate: Path, rank: int, running) -> int:
    """The pid of ``rank`` once it waits at the stage gate before its first stage."""
    marker = gate / f"rank{rank}.stage0"
    deadline = time.monotonic() + BOUND_S
    while not (marker.exists() and marker.read_text()):
        assert running() and time.monotonic() < deadline, "the rank never reached the gate"
        time.sleep(0.05)
    return int(marker.read_text())


def wait_until(check, what: str, poll_s: float = 0.05) -> None:
    """Poll ``check()`` until it holds; fail with ``what`` after BOUND_S seconds."""
    deadline = time.monotonic() + BOUND_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(poll_s)
