"""Rank processes that share only a directory (the storage transport): the same plans give DuckDB's
answers; a failure ends the query with one message naming the rank; the job's objects are gone
afterwards, whatever happened. (The .test corpus over storage: tests/sql/test_sqllogic.py; a killed
rank: tests/distributed/test_failures_dist.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from test_queries_dist import TPCH_JOINS
from test_tpch22_dist import assert_22_match

import duckflock
from duckflock.testing.tpch import queries
from support import BOUND_S, assert_same, oracle, rank_at_gate, stage_gate, wait_until

pytestmark = pytest.mark.dist


def storage(data: Path, exchange: Path, ranks: int, **config: object) -> duckflock.Session:
    return duckflock.connect(
        str(data), ranks=ranks, transport="storage", config={"exchange_uri": str(exchange), **config}
    )


def assert_removed(exchange: Path) -> None:
    assert not exchange.exists() or list(exchange.iterdir()) == [], list(exchange.rglob("*"))


def wait_messages_removed(exchange: Path) -> None:
    """Every message object of the queries so far is passed by every rank and deleted by its sender
    (heartbeats stay)."""

    def messages() -> list[Path]:
        return list(exchange.glob("*/msg/*"))

    wait_until(lambda: not messages(), f"message objects remain: {messages()}")


def _bad_partition(root: Path) -> int:
    import duckdb

    catalog = duckflock.catalog.Catalog.load(root)
    return next(
        p
        for p, info in enumerate(catalog.table("bad").partitions)
        if duckdb.execute(
            f"SELECT count(*) FROM '{catalog.path(info.files[0])}' WHERE s = 'oops'"
        ).fetchall()[0][0]
    )


@pytest.mark.parametrize("ranks", [2, 3])
def test_tpch_joins_over_storage_match_duckdb(tpch_dir, tmp_path, ranks):
    exchange = tmp_path / "exchange"
    ref = oracle(tpch_dir)
    # Broadcasts off: every join shuffles, so rows really cross ranks through the directory.
    with storage(tpch_dir, exchange, ranks, broadcast_threshold_bytes=0) as db:
        for query, order in TPCH_JOINS:
            assert_same(db.sql(query).arrow(), ref.sql(query).to_arrow_table(), order)
    assert_removed(exchange)


def test_tpch_22_over_storage_match_duckdb(tpch_dir, tmp_path):
    """Every TPC-H query, none answered on the driver; each query's objects are deleted in the
    session, not only when it ends."""
    exchange = tmp_path / "exchange"
    results: list[pa.Table | str] = []
    with storage(tpch_dir, exchange, 2, driver_fallback_bytes=0) as db:
        for q in queries().values():
            try:
                results.append(db.sql(q).arrow())
            except duckflock.DuckflockError as e:
                results.append(str(e))
            wait_messages_removed(exchange)
    assert_22_match(tpch_dir, results)
    assert_removed(exchange)


def assert_cli_error_names_the_rank(bad_dir: Path, ranks: int, exchange: str) -> None:
    """`duckflock sql` over the storage exchange, with a conversion error on one rank: exit code 1
    and one message naming that rank."""
    cli = (sys.executable, "-m", "duckflock.cli.main", "sql", "--data", str(bad_dir))
    proc = subprocess.run(
        [
            *(*cli, "--ranks", str(ranks), "--transport", "storage", "--exchange-uri", exchange),
            "SELECT k, CAST(s AS INTEGER) AS n FROM bad",
        ],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    assert proc.returncode == 1, proc.stderr
    assert f"rank {_bad_partition(bad_dir) % ranks}," in proc.stderr, proc.stderr
    assert "Conversion Error" in proc.stderr and "oops" in proc.stderr
    assert proc.stderr.count("error:") == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_cli_error_on_one_rank_names_it_and_leaves_no_objects(bad_dir, tmp_path):
    exchange = tmp_path / "exchange"
    assert_cli_error_names_the_rank(bad_dir, 3, str(exchange))
    assert_removed(exchange)


def test_interrupted_query_is_cancelled_and_the_session_goes_on(bad_dir, tmp_path, monkeypatch):
    """Ctrl-C in the caller while the ranks hold at a gate: the query stops on every rank, the
    session answers the next query, and nothing is left in the directory at the end."""
    gate = stage_gate(tmp_path, monkeypatch)
    exchange = tmp_path / "exchange"
    with storage(bad_dir, exchange, 2) as db:

        def interrupt_at_gate() -> None:
            rank_at_gate(gate, 1, lambda: True)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt_at_gate, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            db.sql("SELECT count(*) FROM good")
        (gate / "hold").unlink()
        assert db.sql("SELECT count(*) FROM good JOIN bad USING (k)").fetchall() == [(2000,)]
        wait_messages_removed(exchange)
    assert_removed(exchange)


def test_failed_query_leaves_no_message_objects(bad_dir, tmp_path):
    """A conversion error on one rank mid-exchange: the session goes on, and the failed query's
    objects are deleted too."""
    exchange = tmp_path / "exchange"
    with storage(bad_dir, exchange, 2, broadcast_threshold_bytes=0) as db:
        with pytest.raises(duckflock.DuckflockError, match="oops"):
            db.sql("SELECT g.k, CAST(b.s AS INTEGER) AS n FROM good g JOIN bad b USING (k)").arrow()
        wait_messages_removed(exchange)
        assert db.sql("SELECT count(*) FROM good JOIN bad USING (k)").fetchall() == [(2000,)]
        wait_messages_removed(exchange)
    assert_removed(exchange)


def test_unusable_exchange_uri_fails_the_start_with_the_ranks_reason(bad_dir):
    with pytest.raises(duckflock.DuckflockError, match=r"did not start: cannot exchange through /proc/nope"):
        storage(bad_dir, Path("/proc/nope"), 2)
