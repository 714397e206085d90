"""duckflock over Arrow Flight across "hosts": one worker per Linux network namespace, each with its
own address and loopback, joined by a bridge; the test process (the caller) in the root namespace.
Results are compared with single-process DuckDB, also over rate-limited links. Skipped where
namespaces cannot be built (not root, no iproute2)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pyarrow.flight as flight
import pytest

import duckflock
from duckflock.testing.tpch import SEED_ORDER, SEED_QUERY, query
from flight_support import Workers
from netns_support import Hosts
from support import assert_same, oracle, rank_at_gate

pytestmark = pytest.mark.dist
QUERIES = [
    (SEED_QUERY, SEED_ORDER),
    (query(3), ["revenue"]),
    (query(5), ["revenue"]),
    (query(9), ["nation", "o_year"]),
    (query(18), ["o_totalprice"]),
]


def _on_hosts(hosts: Hosts) -> list[tuple[str, list[str]]]:
    return [(hosts.address(i), hosts.prefix(i)) for i in range(hosts.n)]


@pytest.fixture(scope="module")
def hosts():
    with Hosts(3) as h:
        yield h


@pytest.fixture(scope="module")
def workers(hosts, tpch_dir, tmp_path_factory):
    # Workers stop before the namespaces go (this fixture is torn down first).
    with Workers(tpch_dir, 3, tmp_path_factory.mktemp("multihost"), hosts=_on_hosts(hosts)) as w:
        yield w


def _check_queries(db: duckflock.Session, tpch_dir, queries=QUERIES) -> None:
    ref = oracle(tpch_dir)
    for q, order in queries:
        assert_same(db.sql(q).arrow(), ref.sql(q).to_arrow_table(), order)


@pytest.mark.parametrize("shared", [True, False])
def test_queries_across_hosts_match_duckdb(hosts, workers, tpch_dir, shared):
    assert [a.rsplit(":", 1)[0] for a in workers.addresses] == [hosts.address(i) for i in range(3)]
    with duckflock.connect(
        workers=workers.addresses, token=workers.token, config={"shared_storage": shared}
    ) as db:
        _check_queries(db, tpch_dir)
        # The exchanges really crossed the hosts' links (not some loopback shortcut).
        before = hosts.link_tx_bytes()
        stats = db.sql(SEED_QUERY, profile=True).stats
        after = hosts.link_tx_bytes()
    assert sum(s.exchange.bytes_out for s in stats) > 0
    sent = [a - b for a, b in zip(after, before, strict=True)]
    assert all(n > 0 for n in sent), sent


def _answers(address: str, token: str) -> bool:
    """Whether a duckflock worker holding ``token`` answers a ping at ``address``."""
    client = flight.FlightClient(f"grpc+tcp://{address}")
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())], timeout=5)
    try:
        return [r.body.to_pybytes() for r in client.do_action(flight.Action("ping", b""), options)] == [b"ok"]
    except flight.FlightError:
        return False
    finally:
        client.close()


def test_worker_listens_only_on_its_address(hosts, workers):
    port = int(workers.addresses[0].rsplit(":", 1)[1])
    assert _answers(workers.addresses[0], workers.token)  # reachable where it was told to listen
    # Not on the root namespace's loopback (with the token, so another server on that port by
    # chance would not count as "our worker answered")...
    assert not _answers(f"127.0.0.1:{port}", workers.token)
    # ...and not on its own host's loopback either: it bound the given address, not 0.0.0.0.
    probe = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=3).close()\n"
        "    print('connected')\n"
        "except ConnectionRefusedError:\n"
        "    print('refused')\n"
    )
    done = subprocess.run(
        [*hosts.prefix(0), sys.executable, "-c", probe], capture_output=True, text=True, timeout=30
    )
    assert done.stdout.strip() == "refused", (done.stdout, done.stderr)


@pytest.mark.parametrize(
    "rate, delay",
    [("100mbit", None), ("100mbit", "5ms")],
    ids=["100mbit", "100mbit-5ms"],
)
def test_slow_links_give_correct_results(tpch_dir, tmp_path, rate, delay):
    # The delay case needs sch_netem and is skipped (with the reason) on kernels without it.
    with (
        Hosts(3, rate=rate, delay=delay) as hosts,
        Workers(tpch_dir, 3, tmp_path, hosts=_on_hosts(hosts)) as w,
        duckflock.connect(
            # Not shared: small tables are broadcast too, so more of the work crosses the slow links.
            workers=w.addresses,
            token=w.token,
            config={"shared_storage": False},
        ) as db,
    ):
        assert hosts.shaping.startswith(("tbf", "netem")), hosts.shaping
        _check_queries(db, tpch_dir, [QUERIES[0], QUERIES[3], QUERIES[4]])


def test_a_host_cut_off_mid_query_ends_it_within_the_peer_timeout(tpch_dir, tmp_path, monkeypatch):
    # No reset reaches the others when a host's link goes down (unlike a killed worker): only the
    # heartbeats' silence tells. The cut lands while every rank holds at its first stage gate.
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "hold").touch()
    monkeypatch.setenv("DUCKFLOCK_STAGE_GATE_DIR", str(gate))
    join = (
        "SELECT count(*) AS n FROM lineitem JOIN orders ON l_orderkey = o_orderkey AND l_partkey > o_custkey"
    )
    with Hosts(3) as hosts, Workers(tpch_dir, 3, tmp_path / "w", hosts=_on_hosts(hosts)) as w:
        db = duckflock.connect(
            workers=w.addresses,
            token=w.token,
            config={"broadcast_threshold_bytes": 0, "stream_min_bytes": 0, "peer_timeout_s": 5},
        )
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["result"] = db.sql(join)
            except duckflock.DuckflockError as e:
                outcome["error"] = str(e)

        t = threading.Thread(target=run)
        t.start()
        rank_at_gate(gate, 2, t.is_alive)
        hosts.cut(2)
        start = time.monotonic()
        (gate / "hold").unlink()
        t.join(timeout=60)
        assert not t.is_alive(), "the query did not end after a host was cut off"
        assert "worker 2" in outcome.get("error", ""), outcome
        assert "Traceback" not in outcome["error"], outcome["error"]
        assert time.monotonic() - start < 30
