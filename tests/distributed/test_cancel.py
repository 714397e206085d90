"""Stop means stop: a query is cancelled inside DuckDB, in a stage of every kind, from
``Session.interrupt()``, Ctrl-C in the caller, and SIGINT/SIGTERM to the CLI; it stops on every rank
within a liveness bound (uncancelled, each query below runs for minutes), and the next query of
the same session gets DuckDB's answer, with no spill file left behind.

Faults come at observed points: every rank holds at a stage gate (``support.stage_gate``) until the test
has seen it there, then the test releases the gate and cancels, so the cancel lands while a stage
runs (inside DuckDB, or just before its call: both must stop). Times are liveness bounds only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import duckflock
from duckflock.exchange.kinds import ExchangeKind
from support import BOUND_S, make_table, oracle, rank_at_gate, stage_gate, wait_until

pytestmark = pytest.mark.dist

STOP_S = 20.0  # a cancelled query ends within this (uncancelled: minutes)


def _join(right: str, cheap: bool = False, where: str = "") -> str:
    """Every row of a meets a quarter of ``right``: 4e10 joined rows; ``cheap``: 22,500."""
    where = f" WHERE a.i < 300 AND {right}.i < 300" if cheap else where
    return f"SELECT count(*) AS n, sum(a.v + {right}.v) AS s FROM a JOIN {right} ON a.k = {right}.k{where}"


SLOW_JOIN, CHEAP = _join("b"), _join("b", cheap=True)
NEXT = "SELECT k, count(*) AS n, sum(v) AS s FROM a GROUP BY k ORDER BY k"


def _noted(text: str) -> Callable[[duckflock.Result], bool]:
    return lambda result: any(text in st.note for st in result.stats)


def _sorted_in_ranges(result: duckflock.Result) -> bool:
    return any(
        s.output is not None and s.output.kind is ExchangeKind.SORT for s in result.outcome.plan.stages
    )


# stage kind -> (config, slow query, cheap query of the same shape, whether its profile shows the kind)
KINDS: dict[str, tuple[dict[str, object], str, str, Callable[[duckflock.Result], bool]]] = {
    "fused": ({"fuse_min_bytes": 0}, SLOW_JOIN, CHEAP, _noted("run once for ranks")),
    "partition runs": (  # a's rows hashed into c's partitions, joined a group of them at a time
        {"partition_run_bytes": 1, "stream_inputs": False, "broadcast_threshold_bytes": 0},
        _join("c"),
        _join("c", cheap=True),
        _noted("ran once per group of partitions"),
    ),
    "streamed": (  # a's rows stream in once they outnumber b's (3e7 joined rows in the cheap one)
        {"broadcast_threshold_bytes": 0, "stream_min_bytes": 0},
        SLOW_JOIN,
        _join("b", where=" WHERE b.i < 300"),
        lambda result: any(st.streamed for st in result.stats),
    ),
    "range sort": (
        {"range_sort_threshold_bytes": 0, "fuse_min_bytes": 1 << 40},
        "SELECT a.i AS x, b.i AS y FROM a JOIN b ON a.k = b.k ORDER BY x, y",
        "SELECT a.i AS x, b.i AS y FROM a JOIN b ON a.k = b.k WHERE a.i < 300 AND b.i < 300 ORDER BY x, y",
        _sorted_in_ranges,
    ),
    "plain": ({"fuse_min_bytes": 1 << 40}, SLOW_JOIN, CHEAP, lambda result: not _noted("run once")(result)),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cancel")
    make_table(root, "a", "SELECT i, i % 4 AS k, i * 2 AS v FROM range(400000) t(i)", 4, "hash", ("i",))
    make_table(root, "b", "SELECT i, i % 4 AS k, i * 3 AS v FROM range(400000) t(i)", 4, "hash", ("i",))
    make_table(root, "c", "SELECT i, i % 4 AS k, i * 3 AS v FROM range(400000) t(i)", 4, "hash", ("k",))
    return root


def _files(spill: Path) -> list[Path]:
    return [p for p in spill.rglob("*") if p.is_file()]


def _run_aside(db, sql: str) -> tuple[threading.Thread, list[BaseException], list[object]]:
    failed: list[BaseException] = []
    got: list[object] = []

    def run() -> None:
        try:
            got.append(db.sql(sql).arrow())
        except BaseException as e:
            failed.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, failed, got


def _expect_next_query_right(db, data: Path) -> None:
    assert db.sql(NEXT).fetchall() == oracle(data).sql(NEXT).fetchall()


@pytest.mark.parametrize("kind", list(KINDS))
def test_interrupt_stops_a_stage_of_every_kind(data, tmp_path, kind, monkeypatch):
    config, slow, cheap, shows = KINDS[kind]
    gate, spill = stage_gate(tmp_path, monkeypatch), tmp_path / "spill"
    config = {**config, "temp_dir": str(spill)}
    with duckflock.connect(str(data), ranks=2, transport="threads", config=config) as db:
        (gate / "hold").unlink()
        profiled = db.sql(cheap, profile=True)  # the plan and mechanism the slow query gets
        assert profiled.fetchall() == oracle(data).sql(cheap).fetchall()
        assert shows(profiled), [st.note for st in profiled.stats]
        (gate / "hold").touch()
        for marker in gate.glob("rank*"):
            marker.unlink()
        thread, failed, _ = _run_aside(db, slow)
        rank_at_gate(gate, 1, thread.is_alive)
        (gate / "hold").unlink()
        t0 = time.monotonic()
        db.interrupt()
        thread.join(STOP_S)
        assert not thread.is_alive(), f"{kind}: still running {STOP_S:.0f} s after the cancel"
        assert failed and isinstance(failed[0], duckflock.QueryCancelled), failed
        assert time.monotonic() - t0 < STOP_S
        wait_until(lambda: not _files(spill), "a cancelled query left spill files")
        _expect_next_query_right(db, data)


def test_ctrl_c_in_the_caller_stops_a_query_inside_duckdb(data, tmp_path, monkeypatch):
    """Ctrl-C in the main thread while rank 0 runs a fused stage inside DuckDB (whose calls never
    return to Python for a signal): KeyboardInterrupt within the bound, and the session goes on."""
    gate = stage_gate(tmp_path, monkeypatch)
    config = {"fuse_min_bytes": 0}
    with duckflock.connect(str(data), ranks=2, transport="threads", config=config) as db:

        def interrupt_when_running() -> None:
            rank_at_gate(gate, 0, lambda: True)
            (gate / "hold").unlink()
            os.kill(os.getpid(), signal.SIGINT)  # to the main thread, waiting in db.sql

        threading.Thread(target=interrupt_when_running, daemon=True).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            db.sql(SLOW_JOIN)
        assert time.monotonic() - t0 < BOUND_S
        _expect_next_query_right(db, data)


def test_interrupt_stops_an_mpi_session_query_and_the_session_goes_on(data, tmp_path, monkeypatch):
    """An MPI job of two processes: the cancel travels to rank 0 over the session's socket."""
    gate = stage_gate(tmp_path, monkeypatch)
    config = {"ranks_per_process": 1, "fuse_min_bytes": 1 << 40}
    with duckflock.connect(str(data), ranks=2, transport="mpi", config=config) as db:
        thread, failed, _ = _run_aside(db, SLOW_JOIN)
        rank_at_gate(gate, 1, thread.is_alive)
        (gate / "hold").unlink()
        db.interrupt()
        thread.join(STOP_S)
        assert not thread.is_alive(), f"still running {STOP_S:.0f} s after the cancel"
        assert failed and isinstance(failed[0], duckflock.QueryCancelled), failed
        _expect_next_query_right(db, data)


def test_interrupt_with_no_query_running_changes_nothing(data):
    with duckflock.connect(str(data), ranks=2, transport="threads") as db:
        db.interrupt()
        _expect_next_query_right(db, data)
        db.interrupt()
        _expect_next_query_right(db, data)


@pytest.mark.parametrize("per_process", [0, 1], ids=["threads-of-a-child", "mpi"])
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_signal_stops_the_cli_inside_duckdb(data, tmp_path, signame, per_process, monkeypatch):
    """The user's case: a query of minutes in a fused stage (or, one rank per process, a plain one)
    gets Ctrl-C or SIGTERM once it runs: one line, exit 128 + the signal, no rank and no spill
    directory left."""
    gate, spill = stage_gate(tmp_path, monkeypatch), tmp_path / "spill"
    sig = getattr(signal, signame)
    env = {
        **os.environ,
        "DUCKFLOCK_TEMP_DIR": str(spill),
        "DUCKFLOCK_FUSE_MIN_BYTES": "0",
        "DUCKFLOCK_RANKS_PER_PROCESS": str(per_process),
    }
    argv = [sys.executable, "-m", "duckflock.cli.main", "sql", "--data", str(data), "--ranks", "2", SLOW_JOIN]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ranks = [rank_at_gate(gate, r, lambda: proc.poll() is None) for r in (0, 1)]
        (gate / "hold").unlink()
        proc.send_signal(sig)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=STOP_S)
        assert time.monotonic() - t0 < STOP_S
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig and err.strip() == "interrupted", (proc.returncode, err)
    assert out == ""
    wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in ranks), "a rank outlived the CLI")
    wait_until(lambda: not _files(spill), "the stopped CLI left spill files")


def test_an_mpi_session_whose_caller_is_killed_stops_its_query_and_ranks(data, tmp_path, monkeypatch):
    """kill -9 of a Python caller while its MPI job's ranks run a query of minutes: rank 0 sees the
    caller's socket close, cancels the query on every rank and the job ends; nothing is left."""
    gate = stage_gate(tmp_path, monkeypatch)
    script = (
        "import duckflock, sys\n"
        "config = {'ranks_per_process': 1, 'fuse_min_bytes': 1 << 40}\n"
        "with duckflock.connect(sys.argv[1], ranks=2, transport='mpi', config=config) as db:\n"
        f"    db.sql({SLOW_JOIN!r})\n"
    )
    caller = subprocess.Popen([sys.executable, "-c", script, str(data)])
    try:
        ranks = [rank_at_gate(gate, r, lambda: caller.poll() is None) for r in (0, 1)]
        (gate / "hold").unlink()
        caller.kill()
        caller.wait(BOUND_S)
        wait_until(
            lambda: not any(Path(f"/proc/{pid}").exists() for pid in ranks), "a rank outlived its caller"
        )
    finally:
        if caller.poll() is None:
            caller.kill()
