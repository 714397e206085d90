"""Failure paths end the whole job quickly, with one message naming the rank and the cause.

Every test bounds its run time with a subprocess timeout: a hang fails the test instead of stalling
the suite. No test asserts on speed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pytest

import duckflock
from duckflock.exec.stages.stage import STAGE_GATE_ENV
from support import BOUND_S, oracle, rank_at_gate, stage_gate, wait_until

pytestmark = pytest.mark.dist


CLI = [sys.executable, "-m", "duckflock.cli.main"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        env=os.environ.copy(),
    )


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_runtime_error_on_one_rank_names_it(bad_dir, ranks):
    proc = cli(
        "sql", "--data", str(bad_dir), "--ranks", str(ranks), "SELECT k, CAST(s AS INTEGER) AS n FROM bad"
    )
    assert proc.returncode != 0
    # The partition holding row 1003 decides the rank; find it from the catalog, not by hand.
    catalog = duckflock.catalog.Catalog.load(bad_dir)
    import duckdb

    part = next(
        p
        for p, info in enumerate(catalog.table("bad").partitions)
        if duckdb.execute(
            f"SELECT count(*) FROM '{catalog.path(info.files[0])}' WHERE s = 'oops'"
        ).fetchall()[0][0]
    )
    assert f"rank {part % ranks}" in proc.stderr, proc.stderr
    assert "Conversion Error" in proc.stderr and "oops" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("error:") == 1, proc.stderr


def test_error_while_others_wait_in_a_shuffle(bad_dir):
    """One rank fails producing its side of a shuffle join while the others wait for its rows."""
    proc = cli(
        "sql",
        "--data",
        str(bad_dir),
        "--ranks",
        "4",
        "SELECT count(*) FROM good g JOIN (SELECT CAST(s AS BIGINT) AS k FROM bad) b ON g.v = b.k",
    )
    assert proc.returncode != 0
    assert "Conversion Error" in proc.stderr and "rank " in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("query", "needle"),
    [
        ("SELECT nosuch FROM good", "nosuch"),
        ("SELECT * FROM missing_table", "missing_table"),
        ("SELEC 1", "parse"),
        (
            "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r",
            "WITH RECURSIVE",
        ),
        ("SELECT k, v FROM good USING SAMPLE 10%", "SAMPLE"),
        ("INSERT INTO good VALUES (1, 2)", "only SELECT"),
    ],
)
def test_bad_query_fails_cleanly(bad_dir, query, needle, monkeypatch):
    # Nothing goes to the driver fallback: what duckflock cannot distribute is refused by name.
    monkeypatch.setenv("DUCKFLOCK_DRIVER_FALLBACK_BYTES", "-1")
    proc = cli("sql", "--data", str(bad_dir), "--ranks", "2", query)
    assert proc.returncode == 1
    assert needle.lower() in proc.stderr.lower(), proc.stderr
    assert "Traceback" not in proc.stderr


def test_unreadable_file_names_rank_and_file(bad_dir):
    proc = cli("sql", "--data", str(bad_dir), "--ranks", "2", "SELECT count(*) FROM gone")
    assert proc.returncode == 1
    assert "rank 1" in proc.stderr and "gone.1.parquet" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("env", "args", "needle"),
    [
        (
            {"DUCKFLOCK_MEMORY_LIMIT_BYTES": "1GB"},
            [],
            "DUCKFLOCK_MEMORY_LIMIT_BYTES='1GB' is not a whole number",
        ),
        ({"DUCKFLOCK_TEMP_DIR": "/proc/nowhere"}, [], "cannot make a spill directory in /proc/nowhere"),
        ({"DUCKFLOCK_COMPRESSION": "gzip"}, [], "compression must be one of none, lz4, zstd, not 'gzip'"),
        ({"DUCKFLOCK_THREADS": "-3"}, [], "threads must not be negative, not -3"),
        (
            {"DUCKFLOCK_TIME_ZONE": "Bad/Zone"},
            [],
            "time_zone 'Bad/Zone': Not implemented Error: Unknown TimeZone",
        ),
        ({}, ["--output", "/proc/nowhere/x.parquet"], "cannot write /proc/nowhere/x.parquet"),
        ({}, ["--output", "/proc/nowhere/"], "cannot write into /proc/nowhere"),
    ],
)
def test_bad_settings_and_unwritable_places_give_one_message(bad_dir, monkeypatch, env, args, needle):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    proc = cli("sql", "--data", str(bad_dir), "--ranks", "2", *args, "SELECT count(*) FROM good")
    assert proc.returncode == 1
    assert needle in proc.stderr and proc.stderr.count("error:") == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_data_directory(tmp_path):
    proc = cli("sql", "--data", str(tmp_path / "nowhere"), "--ranks", "2", "SELECT 1")
    assert proc.returncode == 1
    assert "not a duckflock data directory" in proc.stderr


def test_failed_query_leaves_no_output_file(bad_dir, tmp_path):
    target = tmp_path / "result.parquet"
    proc = cli(
        "sql",
        "--data",
        str(bad_dir),
        "--ranks",
        "2",
        "--output",
        str(target),
        "SELECT CAST(s AS INTEGER) FROM bad",
    )
    assert proc.returncode == 1
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []
    ok = cli("sql", "--data", str(bad_dir), "--ranks", "2", "--output", str(target), "SELECT * FROM good")
    assert ok.returncode == 0, ok.stderr
    import pyarrow.parquet as pq

    assert pq.read_table(target).num_rows == 2000


def test_cli_job_leaves_no_spill_files(bad_dir, tmp_path):
    """The forked child of a CLI job exits without Python's teardown (exec/hosting/forked.exit_child): its
    spill directories still go, after a query whose received rows all spilled and after one that
    failed, and its output and exit code still arrive."""
    spill = tmp_path / "spill"
    env = {**os.environ, "DUCKFLOCK_TEMP_DIR": str(spill), "DUCKFLOCK_EXCHANGE_MEMORY_BYTES": "1"}
    join = "SELECT count(*) AS n FROM good a JOIN bad b ON a.k = b.k"
    for query, code, needle in ((join, 0, "2000"), ("SELECT CAST(s AS INTEGER) FROM bad", 1, "oops")):
        proc = subprocess.run(
            [*CLI, "sql", "--data", str(bad_dir), "--ranks", "2", "--profile", query],
            capture_output=True,
            text=True,
            timeout=BOUND_S,
            env=env,
        )
        assert proc.returncode == code, proc.stderr
        assert needle in proc.stdout + proc.stderr
        assert spill.is_dir() and not any(spill.iterdir())


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT k, CAST(s AS INTEGER) AS n FROM bad",
        "SELECT g.v, CAST(b.s AS INTEGER) AS n FROM good g JOIN bad b ON g.k = b.k",
        "SELECT CAST(t AS INTEGER) AS n FROM (SELECT k, s || '' AS t FROM bad) AS d",
    ],
)
def test_runtime_error_is_duckdbs_about_the_users_query(bad_dir, sql):
    """The ranks run a rewrite of the query (columns "bad.s", "__o1"): the message is DuckDB's own
    about the query as written, which it quotes once instead of the rewrite's line."""
    with pytest.raises(duckdb.ConversionException) as single:
        oracle(bad_dir, threads=1).sql(sql).fetchall()
    duckdbs = str(single.value).split("\n\nLINE ")[0]
    with duckflock.connect(bad_dir, ranks=2) as db, pytest.raises(duckflock.ExecutionError) as info:
        db.sql(sql)
    assert info.value.cause == f"{duckdbs}\n\nQuery: {sql}"


def test_session_survives_failures(bad_dir):
    with duckflock.connect(bad_dir, ranks=3) as db:
        with pytest.raises(duckflock.ExecutionError) as info:
            db.sql("SELECT CAST(s AS INTEGER) FROM bad")
        assert "Conversion Error" in str(info.value)
        with pytest.raises(duckflock.SqlError):
            db.sql("SELECT nosuch FROM good")
        for _ in range(2):
            assert db.sql("SELECT count(*) AS n, sum(v) AS s FROM good").fetchall() == [
                (2000, 2 * sum(range(2000)))
            ]


def test_out_of_memory_is_reported_not_fatal(bad_dir):
    """A rank's DuckDB running out of its memory share fails the query with DuckDB's message."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "duckflock.cli.main",
            "sql",
            "--data",
            str(bad_dir),
            "--ranks",
            "2",
            "SELECT len(list(r.i)) AS n FROM range(40000000) r(i)",
        ],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        env={**os.environ, "DUCKFLOCK_MEMORY_LIMIT_BYTES": str(64 << 20)},
    )
    assert proc.returncode == 1
    assert "Out of Memory" in proc.stderr and "rank " in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@contextmanager
def cli_held_at_gate(
    bad_dir: Path, tmp_path: Path, query: str, per_process: int = 1, ranks: int = 2
) -> Iterator[tuple[subprocess.Popen, Path]]:
    """``duckflock sql`` on ``ranks`` ranks, ``per_process`` in each process (0: all, in a child of
    the CLI), that hold at a stage gate until the test acts (killed if it is still running when the
    block ends); they spill into ``tmp_path/spill``."""
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "hold").touch()
    proc = subprocess.Popen(
        [*CLI, "sql", "--data", str(bad_dir), "--ranks", str(ranks), query],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "DUCKFLOCK_STAGE_GATE_DIR": str(gate),
            "DUCKFLOCK_RANKS_PER_PROCESS": str(per_process),
            "DUCKFLOCK_TEMP_DIR": str(tmp_path / "spill"),
        },
    )
    try:
        yield proc, gate
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize(
    ("per_process", "ranks", "victim", "named"),
    [
        (1, 2, 0, "rank 0 was"),
        (1, 2, 1, "rank 1 was"),
        (2, 4, 3, "the process of ranks 2-3 was"),
        (0, 2, 1, "the process of ranks 0-1 was"),
    ],
    ids=["mpi-rank0", "mpi-rank1", "mpi-2-per-process", "threads-of-a-child"],
)
def test_rank_killed_by_the_os_is_named_without_mpich_banner(
    bad_dir, tmp_path, per_process, ranks, victim, named
):
    """What the OOM killer does, at an observed point: every rank holds at a stage gate, the test
    kills one with SIGKILL; the job ends with one duckflock message naming that rank (or the ranks
    of its process) and the signal, and the killed process's spill directory is gone."""
    import signal

    query = "SELECT count(*) FROM good JOIN bad USING (k)"
    with cli_held_at_gate(bad_dir, tmp_path, query, per_process, ranks) as (proc, gate):
        os.kill(rank_at_gate(gate, victim, lambda: proc.poll() is None), signal.SIGKILL)
        out, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode != 0
    assert f"{named} killed by signal 9 (SIGKILL)" in err, err
    assert "out-of-memory" in err
    assert "BAD TERMINATION" not in out + err and "Traceback" not in err, out + err
    assert err.count("error:") == 1, err
    if per_process == 0:  # the CLI removed it (a killed MPI process's goes at the next start)
        assert not any((tmp_path / "spill").iterdir())


def test_signal_to_a_cli_just_started_is_not_lost(bad_dir, tmp_path):
    """SIGTERM (timeout's) the moment the CLI has become the waiter of the child running the
    ranks, before either handles signals: held until they do, the job ends as interrupted."""
    import signal

    with cli_held_at_gate(bad_dir, tmp_path, "SELECT count(*) FROM good", per_process=0) as (proc, _gate):
        wait_until(
            lambda: b"guard.py" in Path(f"/proc/{proc.pid}/cmdline").read_bytes() or proc.poll() is not None,
            "the CLI never became the waiter",
            poll_s=0,
        )
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 128 + signal.SIGTERM and err.strip() == "interrupted", err
    assert not any((tmp_path / "spill").glob("*"))


def test_second_ctrl_c_ends_the_cli_at_once_with_one_message(bad_dir, tmp_path):
    """Two Ctrl-Cs while the ranks hold at a stage gate: the second, during the first's clean-up,
    ends the child at once; one "interrupted", nothing else, no spill left."""
    import signal

    with cli_held_at_gate(bad_dir, tmp_path, "SELECT count(*) FROM good", per_process=0) as (proc, gate):
        rank_at_gate(gate, 0, lambda: proc.poll() is None)
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 130 and err.strip() == "interrupted", err
    assert not any((tmp_path / "spill").glob("*"))


def test_stopped_cli_stops_its_ranks_and_goes_on(bad_dir, tmp_path):
    """Ctrl-Z (SIGTSTP) to the CLI whose child runs the ranks: the child, in a process group of
    its own, stops with it, goes on with it (SIGCONT), and the query completes."""
    import signal

    with cli_held_at_gate(bad_dir, tmp_path, "SELECT count(*) FROM good", per_process=0) as (proc, gate):
        rank = rank_at_gate(gate, 0, lambda: proc.poll() is None)
        proc.send_signal(signal.SIGTSTP)
        wait_until(lambda: _state(rank) == "T" and _state(proc.pid) == "T", "the job did not stop")
        proc.send_signal(signal.SIGCONT)
        wait_until(lambda: _state(rank) != "T" and _state(proc.pid) != "T", "the job did not go on")
        (gate / "hold").unlink()
        out, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 0, err
    assert "2000" in out, out


def test_killed_cli_takes_its_ranks_with_it(bad_dir, tmp_path):
    """The CLI whose child runs the ranks as threads is killed: the child dies with it, instead of
    computing for no one."""
    import signal

    with cli_held_at_gate(bad_dir, tmp_path, "SELECT count(*) FROM good", per_process=0) as (proc, gate):
        rank = rank_at_gate(gate, 0, lambda: proc.poll() is None)
        assert rank != proc.pid
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=BOUND_S)
    wait_until(lambda: _gone(rank), "the ranks outlived the CLI")


def _state(pid: int) -> str:
    """The process's state letter (R, S, T, Z, ...) from /proc."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _gone(pid: int) -> bool:
    """Ended: no such process, or a zombie its new parent has yet to reap."""
    try:
        return _state(pid) == "Z"
    except OSError:
        return True


def test_killed_guard_ends_the_job_and_its_rank(bad_dir, tmp_path):
    """The small process that watches a rank is killed (by hand, or the OOM killer): its rank dies
    with it and the job ends with one message, instead of the orphaned rank holding mpiexec forever."""
    import signal

    with cli_held_at_gate(bad_dir, tmp_path, "SELECT count(*) FROM good JOIN bad USING (k)") as (proc, gate):
        rank = rank_at_gate(gate, 1, lambda: proc.poll() is None)
        guard = int(Path(f"/proc/{rank}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(guard, signal.SIGKILL)
        _, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode != 0 and "ended abnormally" in err, err
    assert err.count("error:") == 1 and "BAD TERMINATION" not in err, err
    wait_until(lambda: _gone(rank), "the rank outlived its guard")


@pytest.mark.parametrize("per_process", [1, 0], ids=["mpi", "threads-of-a-child"])
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_interrupted_cli_ends_the_whole_job(bad_dir, tmp_path, signame, per_process):
    """Ctrl-C or SIGTERM (timeout, a scheduler) to the CLI while every rank holds at a stage gate:
    the CLI says so and exits with 128 + the signal's number, and no rank (nor mpiexec) is left
    running."""
    import signal

    query = "SELECT count(*) FROM good"
    sig = getattr(signal, signame)
    with cli_held_at_gate(bad_dir, tmp_path, query, per_process) as (proc, gate):
        ranks = [rank_at_gate(gate, r, lambda: proc.poll() is None) for r in (0, 1)]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 128 + sig and err.strip() == "interrupted", err
    # ended by mpiexec, just after it
    wait_until(
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in ranks), "a rank outlived the interrupted CLI"
    )


@pytest.mark.parametrize(
    ("transport", "per_process", "named"),
    [("mpi", 1, "rank 1 was"), ("mpi", 0, "the process of ranks 0-1 was"), ("storage", 1, "rank 1 was")],
)
def test_session_reports_a_killed_rank_and_can_be_reopened(
    bad_dir, tmp_path, transport, per_process, named, monkeypatch
):
    """A storage job's objects (in ``exchange``) are removed too."""
    import signal
    import threading

    gate = stage_gate(tmp_path, monkeypatch)
    exchange = tmp_path / "exchange"
    config = {"ranks_per_process": per_process, "exchange_uri": str(exchange)}
    db = duckflock.connect(str(bad_dir), ranks=2, transport=transport, config=config)
    failure: list[BaseException] = []

    def query() -> None:
        try:
            db.sql("SELECT count(*) FROM good JOIN bad ON good.k = bad.k").arrow()
        except BaseException as e:
            failure.append(e)

    t = threading.Thread(target=query)
    t.start()
    os.kill(rank_at_gate(gate, 1, t.is_alive), signal.SIGKILL)
    t.join(BOUND_S)
    assert not t.is_alive()
    assert failure and isinstance(failure[0], duckflock.DuckflockError), failure
    assert f"{named} killed by signal 9 (SIGKILL)" in str(failure[0])
    db.close()
    assert not any(exchange.rglob("*"))
    monkeypatch.delenv(STAGE_GATE_ENV)  # its hold stays: a new job must not stop there
    with duckflock.connect(str(bad_dir), ranks=2, transport="mpi") as again:
        assert again.sql("SELECT count(*) FROM good").fetchall() == [(2000,)]


def _raise_timeout(*_) -> None:
    raise TimeoutError("the caller's own deadline")


@pytest.mark.parametrize(
    "signame, raised", [("SIGINT", KeyboardInterrupt), ("SIGUSR1", TimeoutError)], ids=["ctrl-c", "handler"]
)
def test_interrupted_session_query_is_cancelled_and_the_session_goes_on(
    bad_dir, tmp_path, signame, raised, monkeypatch
):
    """Ctrl-C, or an exception a signal handler raises (a caller's timeout), in the caller while
    every rank holds at a stage gate: the query is cancelled on every rank and raises it, and the
    next query of the same session gets its own answer (not the cancelled one's: each later query
    once got the one before's rows), as does a new session."""
    import signal
    import threading

    gate = stage_gate(tmp_path, monkeypatch)
    previous = signal.signal(signal.SIGUSR1, _raise_timeout)
    db = duckflock.connect(str(bad_dir), ranks=2, transport="mpi")
    try:

        def interrupt_at_gate() -> None:
            rank_at_gate(gate, 1, lambda: True)
            os.kill(os.getpid(), getattr(signal, signame))  # handled in the main thread, inside db.sql

        threading.Thread(target=interrupt_at_gate, daemon=True).start()
        with pytest.raises(raised):
            db.sql("SELECT count(*) FROM good")
        (gate / "hold").unlink()
        assert db.sql("SELECT 'next' AS q").fetchall() == [("next",)]
        assert db.sql("SELECT count(*) FROM good").fetchall() == [(2000,)]
    finally:
        db.close()
        signal.signal(signal.SIGUSR1, previous)
    with duckflock.connect(str(bad_dir), ranks=2, transport="mpi") as again:
        assert again.sql("SELECT count(*) FROM good").fetchall() == [(2000,)]


def test_interrupted_query_on_thread_ranks_stops_every_rank(bad_dir, tmp_path, monkeypatch):
    """Ctrl-C while rank 0 (the caller's thread) waits and the other ranks hold at a stage gate:
    the query raises KeyboardInterrupt at once and the other ranks are told, so the next query runs
    (rank 1 had gone on with the old query and the next one waited behind it)."""
    import signal
    import threading

    gate = stage_gate(tmp_path, monkeypatch)
    sql = "SELECT count(*) FROM good JOIN bad USING (k)"
    with duckflock.connect(str(bad_dir), ranks=2, transport="threads") as db:

        def interrupt_at_gate() -> None:
            rank_at_gate(gate, 1, lambda: True)
            os.kill(os.getpid(), signal.SIGINT)  # delivered to the main thread, inside db.sql

        threading.Thread(target=interrupt_at_gate, daemon=True).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            db.sql(sql)
        assert time.monotonic() - t0 < BOUND_S
        (gate / "hold").unlink()
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(db.sql("SELECT count(*) FROM good").fetchall()))
        t.start()
        t.join(BOUND_S)
        assert got == [oracle(bad_dir).sql("SELECT count(*) FROM good").fetchall()]


def _older_duckdb(tmp_path: Path) -> list[str]:
    """An environment prefix under which Python reports another DuckDB version (a sitecustomize
    module sets it at start-up): a host with a different install."""
    site = tmp_path / "older-duckdb"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import duckdb\nduckdb.__version__ = '0.9.2'\n")
    return [f"PYTHONPATH={site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"]


def test_flight_workers_of_different_versions_are_refused(bad_dir, tmp_path):
    from flight_support import Workers

    hosts = [("127.0.0.1", []), ("127.0.0.1", ["env", *_older_duckdb(tmp_path)])]
    with Workers(bad_dir, 2, tmp_path / "workers", hosts=hosts) as w:
        with pytest.raises(duckflock.DuckflockError, match="different versions") as e:
            duckflock.connect(workers=w.addresses, token=w.token)
        assert "worker 1: duckdb 0.9.2" in str(e.value)


def test_mpi_ranks_of_different_versions_are_refused(tmp_path):
    from duckflock.exec.hosting.launch import mpiexec_path

    job = [sys.executable, str(Path(__file__).with_name("mpi_bound_job.py"))]
    older = _older_duckdb(tmp_path)[0].split("=", 1)
    argv = [mpiexec_path(), "-n", "1", *job, ":", "-n", "1", "-env", *older, *job]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=BOUND_S)
    assert proc.returncode != 0
    assert "the ranks run different versions" in proc.stderr and "rank 1: duckdb 0.9.2" in proc.stderr


def test_processes_with_different_ranks_per_process_are_refused(bad_dir):
    """Under srun every process reads its own setting: processes that disagree would number their
    ranks differently and make different communicators, so the job stops at once, saying so."""
    from duckflock.exec.hosting.launch import mpiexec_path

    def part(k: int) -> list[str]:
        query = [*CLI, "sql", "--data", str(bad_dir), "SELECT count(*) FROM good"]
        return ["-n", "1", "-env", "DUCKFLOCK_RANKS_PER_PROCESS", str(k), *query]

    argv = [mpiexec_path(), *part(1), ":", *part(2)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=BOUND_S)
    assert proc.returncode != 0
    assert "every process of the job must run as many ranks (process 0: 1, process 1: 2)" in proc.stderr, (
        proc.stderr
    )


@pytest.mark.parametrize("per_process", [0, 1])
def test_session_whose_ranks_cannot_start_says_why(bad_dir, per_process):
    """A setting no rank can use (a spill directory that cannot be made) fails the session's start
    with the ranks' own message, not only mpiexec's exit code."""
    config = {"temp_dir": "/proc/nope", "ranks_per_process": per_process}
    t0 = time.monotonic()
    with pytest.raises(
        duckflock.DuckflockError, match=r"did not start: cannot make a spill directory in /proc/nope"
    ):
        duckflock.connect(str(bad_dir), ranks=2, transport="mpi", config=config)
    assert time.monotonic() - t0 < BOUND_S
