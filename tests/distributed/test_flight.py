"""duckflock over Arrow Flight: real worker processes on loopback, compared with DuckDB; security;
a worker killed mid-shuffle; a caller that disappears."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pyarrow.flight as flight
import pytest

import duckflock
from duckflock.testing.tpch import SEED_ORDER, SEED_QUERY, query
from flight_support import Workers, status
from support import BOUND_S, assert_same, make_table, oracle, rank_at_gate, stage_gate

pytestmark = pytest.mark.dist


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("shared", [False, True])
def test_flight_queries_match_duckdb(tpch_dir, tmp_path, n, shared):
    ref = oracle(tpch_dir)
    with (
        Workers(tpch_dir, n, tmp_path) as w,
        duckflock.connect(workers=w.addresses, token=w.token, config={"shared_storage": shared}) as db,
    ):
        for q, order in [
            (SEED_QUERY, SEED_ORDER),
            (query(3), ["revenue"]),
            (query(5), ["revenue"]),
            (query(9), ["nation", "o_year"]),
            (query(18), ["o_totalprice"]),
            (query(13), ["custdist", "c_count"]),
        ]:
            assert_same(db.sql(q).arrow(), ref.sql(q).to_arrow_table(), order)


def test_wrong_or_missing_token_is_refused(tpch_dir, tmp_path):
    with Workers(tpch_dir, 2, tmp_path) as w:
        with pytest.raises(duckflock.TransportError, match="refused the token"):
            duckflock.connect(workers=w.addresses, token="not-the-token-0123456789")
        client = flight.FlightClient(f"grpc+tcp://{w.addresses[0]}")
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(client.do_action(flight.Action("ping", b"")))  # no token at all


def test_sql_cannot_read_outside_the_data_directory(tpch_dir, tmp_path):
    outside = tmp_path / "secret.csv"
    outside.write_text("a,b\n1,2\n")
    with Workers(tpch_dir, 2, tmp_path) as w, duckflock.connect(workers=w.addresses, token=w.token) as db:
        for q in (
            f"SELECT * FROM read_csv('{outside}')",
            "SELECT * FROM read_csv('https://example.com/x.csv')",
        ):
            with pytest.raises(duckflock.DuckflockError, match="Permission Error"):
                db.sql(q)
        inside = next(tpch_dir.glob("nation/*.parquet"))
        assert db.sql(f"SELECT count(*) AS n FROM read_parquet('{inside}')").fetchall() == [(25,)]


def test_cli_on_workers(tpch_dir, tmp_path):
    with Workers(tpch_dir, 2, tmp_path) as w:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "duckflock.cli.main",
                "sql",
                "--workers",
                ",".join(w.addresses),
                "--token-file",
                str(w.token_file),
                "SELECT count(*) AS n FROM lineitem",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        n = oracle(tpch_dir).sql("SELECT count(*) FROM lineitem").fetchall()[0][0]
        assert str(n) in proc.stdout and " s on 2 workers\n" in proc.stdout, proc.stdout


def test_cli_on_workers_refuses_a_data_directory(tmp_path):
    """The workers read their own data directories: a --data given with --workers is refused, not ignored."""
    token = tmp_path / "token"
    token.write_text("t" * 32)
    proc = _cli(
        "sql", "--workers", "127.0.0.1:1", "--token-file", str(token), "--data", str(tmp_path), "SELECT 1"
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("error: --data does not go with --workers: each worker reads"), proc.stderr


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "duckflock.cli.main", *args], capture_output=True, text=True, timeout=60
    )


def test_a_worker_that_cannot_listen_says_why_in_one_line(tmp_path):
    make_table(tmp_path / "data", "t", "SELECT 1 AS a", 1)
    with Workers(tmp_path / "data", 1, tmp_path) as w:
        taken = w.addresses[0]
        cases = {
            taken: f"cannot listen on {taken}: Address already in use",
            "127.0.0.1:99999": "port 99999 is out of range (0-65535)",
            ":99999": "port 99999 is out of range",
            ":8815": "give the host too",
            "no-such-host.invalid:0": "cannot resolve host 'no-such-host.invalid'",
        }
        for listen, message in cases.items():
            proc = _cli(
                "worker",
                "--listen",
                listen,
                "--data",
                str(tmp_path / "data"),
                "--token-file",
                str(w.token_file),
            )
            assert proc.returncode == 1 and proc.stdout == "", (listen, proc.stdout)
            assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, (listen, proc.stderr)
            assert message in proc.stderr, (listen, proc.stderr)


def test_worker_killed_mid_query_fails_fast_and_survivors_serve_on(tpch_dir, tmp_path, monkeypatch):
    # A shuffle join: the kill must land while the query runs, so every rank holds at a stage gate
    # (a test hook) until the test has seen worker 2 reach its first stage and killed it.
    heavy = (
        "SELECT count(*) FROM lineitem a JOIN lineitem b ON a.l_suppkey = b.l_suppkey "
        "WHERE a.l_comment || b.l_comment LIKE '%zzz%'"
    )
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "hold").touch()
    monkeypatch.setenv("DUCKFLOCK_STAGE_GATE_DIR", str(gate))
    with Workers(tpch_dir, 3, tmp_path) as w:
        db = duckflock.connect(
            workers=w.addresses, token=w.token, config={"broadcast_threshold_bytes": 0, "peer_timeout_s": 10}
        )
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["result"] = db.sql(heavy)
            except duckflock.DuckflockError as e:
                outcome["error"] = e

        t = threading.Thread(target=run)
        start = time.monotonic()
        t.start()
        rank_at_gate(gate, 2, t.is_alive)
        w.kill(2)
        (gate / "hold").unlink()
        t.join(timeout=60)
        assert not t.is_alive(), "the query did not end after a worker died"
        assert "error" in outcome, "a query that lost a worker must not succeed"
        assert "worker 2" in str(outcome["error"]), outcome["error"]
        assert time.monotonic() - start < 60
        db.close()
        # The survivors dropped the failed session and serve the next one.
        with duckflock.connect(workers=w.addresses[:2], token=w.token) as db2:
            n = db2.sql("SELECT count(*) AS n FROM orders").fetchall()
        assert n == oracle(tpch_dir).sql("SELECT count(*) AS n FROM orders").fetchall()


def test_caller_that_disappears_does_not_hold_workers(tpch_dir, tmp_path):
    with Workers(tpch_dir, 2, tmp_path, idle_timeout=2) as w:
        script = (
            "import duckflock, sys, time; "
            f"db = duckflock.connect(workers={w.addresses!r}, token={w.token!r}); "
            "db.sql('SELECT count(*) FROM orders'); print('ready', flush=True); time.sleep(60)"
        )
        caller = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
        )
        assert caller.stdout.readline().strip() == "ready"
        assert all(status(a, w.token)["session"] for a in w.addresses)
        caller.send_signal(signal.SIGKILL)
        caller.wait(timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(status(a, w.token)["session"] for a in w.addresses):
            time.sleep(0.5)
        assert not any(status(a, w.token)["session"] for a in w.addresses)


def test_a_query_longer_than_the_idle_timeout_is_not_cut_off(tpch_dir, tmp_path, monkeypatch):
    """The idle timeout counts from the end of the last call: a query held at a stage gate past
    it (the watchdog looks every second) still completes."""
    gate = stage_gate(tmp_path, monkeypatch)
    with (
        Workers(tpch_dir, 2, tmp_path, idle_timeout=1) as w,
        duckflock.connect(workers=w.addresses, token=w.token) as db,
    ):
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(db.sql("SELECT count(*) FROM orders").fetchall()))
        t.start()
        rank_at_gate(gate, 0, t.is_alive)
        time.sleep(3)  # the query is held, not raced: three of the watchdog's looks past the timeout
        (gate / "hold").unlink()
        t.join(BOUND_S)
        assert got == [oracle(tpch_dir).sql("SELECT count(*) FROM orders").fetchall()]


def test_busy_workers_refuse_another_session_and_idle_ones_are_taken_over(tpch_dir, tmp_path, monkeypatch):
    """A second caller's session would have torn the workers out of the first one's query (which
    then failed after 30 s): while a query runs, every worker refuses it, in either order of the
    worker list; once the first session is idle, the second takes the workers over."""
    gate = stage_gate(tmp_path, monkeypatch)
    sql = "SELECT count(*) FROM orders JOIN customer ON o_custkey = c_custkey"
    with (
        Workers(tpch_dir, 2, tmp_path) as w,
        duckflock.connect(workers=w.addresses, token=w.token) as first,
    ):
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(first.sql(sql).fetchall()))
        t.start()
        for rank in (0, 1):
            rank_at_gate(gate, rank, t.is_alive)
        for order in (w.addresses, w.addresses[::-1]):
            with pytest.raises(duckflock.DuckflockError, match="answering a query of another session"):
                duckflock.connect(workers=order, token=w.token)
        with pytest.raises(duckflock.DuckflockError, match="listed more than once"):
            duckflock.connect(workers=[w.addresses[0], w.addresses[0]], token=w.token)
        (gate / "hold").unlink()
        t.join(BOUND_S)
        assert got == [oracle(tpch_dir).sql(sql).fetchall()]
        with duckflock.connect(workers=w.addresses, token=w.token) as second:
            assert second.sql("SELECT count(*) FROM nation").fetchall() == [(25,)]
        with pytest.raises(duckflock.DuckflockError, match="no session"):
            first.sql("SELECT 1")


def test_tls_workers(tpch_dir, tmp_path):
    """Workers serving grpc+tls: the caller trusts their certificate; a caller without it cannot talk."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"openssl could not make a test certificate: {made.stderr.strip()[:200]}")
    with Workers(tpch_dir, 2, tmp_path, extra=["--tls-cert", str(cert), "--tls-key", str(key)]) as w:
        tls = [f"grpc+tls://{a}" for a in w.addresses]
        with duckflock.connect(workers=tls, token=w.token, tls_root_cert=cert.read_bytes()) as db:
            got = db.sql("SELECT count(*) AS n FROM orders").fetchall()
        assert got == oracle(tpch_dir).sql("SELECT count(*) AS n FROM orders").fetchall()
        with pytest.raises(duckflock.DuckflockError):  # plaintext gRPC to a TLS port fails
            duckflock.connect(workers=w.addresses, token=w.token)


def test_workers_on_hosts_in_other_time_zones_answer_in_the_callers(tmp_path):
    """Hosts set to other time zones (TZ per worker here): every worker renders, truncates, casts
    and hashes TIMESTAMPTZ values in the caller's zone, as the caller's own DuckDB does."""
    data = tmp_path / "data"
    start = "TIMESTAMPTZ '2024-03-09 20:00:00+00'"
    make_table(data, "z", f"SELECT {start} + INTERVAL (i * 37) MINUTE AS ts, i AS v FROM range(400) t(i)", 4)
    make_table(
        data,
        "w",
        "SELECT TIMESTAMP '2024-03-09 20:00:00' + INTERVAL (i * 74) MINUTE AS t FROM range(200) t(i)",
        3,
    )
    hosts = [("127.0.0.1", ["env", "TZ=Asia/Tokyo"]), ("127.0.0.1", ["env", "TZ=America/New_York"])]
    ref = oracle(data)
    with (
        Workers(data, 2, tmp_path / "workers", hosts=hosts) as w,
        duckflock.connect(workers=w.addresses, token=w.token, config={"broadcast_threshold_bytes": 0}) as db,
    ):
        for sql in (
            "SELECT ts::VARCHAR AS s, ts::DATE AS d, date_trunc('day', ts) AS t FROM z",
            "SELECT ts::DATE AS d, count(*) AS n FROM z GROUP BY 1",
            "SELECT hour(ts) AS h, count(*) AS n, sum(v) AS s FROM z GROUP BY 1",
            "SELECT count(*) AS n FROM z JOIN w ON z.ts = w.t",
        ):
            assert_same(db.sql(sql).arrow(), ref.sql(sql).to_arrow_table())
