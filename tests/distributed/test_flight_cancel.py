"""Stopping a query on Flight workers: cancelled by its caller (Session.interrupt, the CLI's Ctrl-C or
SIGTERM), its caller killed or silent, one of its workers frozen. Each time the query stops on every
worker, the workers are free for the next session and leave no spill directories behind.

The query runs for minutes uncancelled (a join of 4e10 row pairs); every worker holds at the stage
gate (a test hook) until all have reached it, so the stop always lands on a running query. The time
bounds are liveness bounds, not speed claims."""

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
from flight_support import Workers, status
from support import assert_same, make_table, oracle, rank_at_gate

pytestmark = pytest.mark.dist

SLOW = "SELECT count(*) AS n, sum(a.v + b.v) AS s FROM t a JOIN t b ON a.g = b.g"
CHECK = "SELECT g, count(*) AS n, sum(v) AS s FROM t GROUP BY g"
STOP_S = 20.0  # a stopped query has ended on every worker within this (they stop within a second)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("slow")
    make_table(root, "t", "SELECT i AS k, i % 4 AS g, i * 0.5 AS v FROM range(400000) t(i)", 4)
    return root


@pytest.fixture
def hooks(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """The stage gate (held) and the spill directory of the workers started after it."""
    gate, spill = tmp_path / "gate", tmp_path / "spill"
    gate.mkdir()
    spill.mkdir()
    (gate / "hold").touch()
    monkeypatch.setenv("DUCKFLOCK_STAGE_GATE_DIR", str(gate))
    monkeypatch.setenv("DUCKFLOCK_TEMP_DIR", str(spill))
    return gate, spill


def _running(gate: Path, ranks: int, alive: Callable[[], bool]) -> None:
    """Once every rank waits at the gate before the join, let them run it."""
    for rank in range(ranks):
        rank_at_gate(gate, rank, alive)
    (gate / "hold").unlink()


def _until(check: Callable[[], bool], what: str, bound: float = STOP_S) -> None:
    deadline = time.monotonic() + bound
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _free(w: Workers, data: Path, addresses: list[str]) -> None:
    """The workers hold no session, and a new session's query on them answers."""
    _until(lambda: not any(status(a, w.token)["session"] for a in addresses), "the workers kept the session")
    with duckflock.connect(workers=addresses, token=w.token) as db:
        assert_same(db.sql(CHECK).arrow(), oracle(data).sql(CHECK).to_arrow_table())


def _free_and_clean(w: Workers, data: Path, spill: Path) -> None:
    """Every worker is free, and none left a spill directory behind."""
    _free(w, data, w.addresses)
    _until(lambda: not list(spill.glob("duckflock-*")), "spill directories were left")


def _in_thread(run: Callable[[], object]) -> tuple[threading.Thread, dict[str, object]]:
    outcome: dict[str, object] = {}

    def call() -> None:
        try:
            outcome["result"] = run()
        except duckflock.DuckflockError as e:
            outcome["error"] = e

    t = threading.Thread(target=call, daemon=True)
    t.start()
    return t, outcome


def test_interrupt_stops_the_query_and_the_session_goes_on(data, tmp_path, hooks):
    gate, spill = hooks
    with Workers(data, 2, tmp_path) as w:
        with duckflock.connect(workers=w.addresses, token=w.token) as db:
            t, outcome = _in_thread(lambda: db.sql(SLOW))
            _running(gate, 2, t.is_alive)
            db.interrupt()
            t.join(STOP_S)
            assert not t.is_alive(), "the query went on after Session.interrupt()"
            assert isinstance(outcome.get("error"), duckflock.QueryCancelled), outcome
            assert "Session.interrupt()" in str(outcome["error"])
            assert all(status(a, w.token)["session"] for a in w.addresses)
            assert_same(db.sql(CHECK).arrow(), oracle(data).sql(CHECK).to_arrow_table())
        _free_and_clean(w, data, spill)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_cli_on_workers_stops_the_query_on_a_signal(data, tmp_path, hooks, sig, code):
    gate, spill = hooks
    with Workers(data, 2, tmp_path) as w:
        workers = ",".join(w.addresses)
        cmd = [sys.executable, "-m", "duckflock.cli.main", "sql", "--workers", workers]
        proc = subprocess.Popen(
            [*cmd, "--token-file", str(w.token_file), SLOW],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _running(gate, 2, lambda: proc.poll() is None)
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=STOP_S)
        finally:
            proc.kill()
        assert proc.returncode == code, err
        assert err.strip() == "interrupted" and out == ""
        _free_and_clean(w, data, spill)


def test_a_killed_caller_does_not_hold_the_workers(data, tmp_path, hooks):
    gate, spill = hooks
    with Workers(data, 2, tmp_path) as w:
        script = (
            f"import duckflock; duckflock.connect(workers={w.addresses!r}, token={w.token!r}).sql({SLOW!r})"
        )
        caller = subprocess.Popen([sys.executable, "-c", script])
        _running(gate, 2, lambda: caller.poll() is None)
        caller.kill()
        caller.wait(timeout=10)
        _free_and_clean(w, data, spill)


def test_a_silent_caller_is_cancelled_after_the_idle_timeout(data, tmp_path, hooks):
    """A caller that is there but says nothing (stopped, cut off: no call, no heartbeat) holds the
    workers no longer than the idle timeout (at least 5 s, five heartbeats) while its query runs."""
    gate, spill = hooks
    with Workers(data, 2, tmp_path, idle_timeout=1) as w:
        script = (
            f"import duckflock; duckflock.connect(workers={w.addresses!r}, token={w.token!r}).sql({SLOW!r})"
        )
        caller = subprocess.Popen([sys.executable, "-c", script])
        try:
            _running(gate, 2, lambda: caller.poll() is None)
            caller.send_signal(signal.SIGSTOP)
            _free_and_clean(w, data, spill)
        finally:
            caller.kill()
            caller.wait(timeout=10)


@pytest.mark.parametrize("frozen", [0, 1])
def test_a_frozen_worker_fails_the_query_naming_it(data, tmp_path, hooks, frozen):
    """A worker stopped (SIGSTOP) mid-query: the caller's query fails within about peer_timeout_s
    naming it, closing the session does not wait for it, the other workers are free again; once
    continued, it drops the session too."""
    gate, spill = hooks
    timeout = 6
    with Workers(data, 3, tmp_path) as w:
        db = duckflock.connect(workers=w.addresses, token=w.token, config={"peer_timeout_s": timeout})
        t, outcome = _in_thread(lambda: db.sql(SLOW))
        pid = w.procs[frozen].pid
        try:
            _running(gate, 3, t.is_alive)
            os.kill(pid, signal.SIGSTOP)
            t.join(timeout + STOP_S)
            assert not t.is_alive(), "the caller waited on a frozen worker"
            assert f"worker {frozen} at" in str(outcome.get("error")), outcome
            start = time.monotonic()
            db.close()
            assert time.monotonic() - start < STOP_S
            _free(w, data, [a for i, a in enumerate(w.addresses) if i != frozen])
        finally:
            os.kill(pid, signal.SIGCONT)
        _free_and_clean(w, data, spill)
