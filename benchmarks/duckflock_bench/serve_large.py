"""``duckflock bench serve``'s large result: some tens of millions of rows read through ADBC from an
endpoint per rank (each rank serving its part, flightsql/parts.py) vs from the server's one
endpoint (the rows gathered on rank 0, held in the server's temp directory), on the same warm
ranks, alternately; with this machine's memcpy bandwidth measured in the same run, the bound of
any read that copies the bytes once. The parts are read by one statement's reader (ADBC's driver
streams every endpoint at once but hands their batches on in endpoint order, a few buffered), and
by a connection per part in threads (ADBC's partitions), as a parallel client reads them.

The result is lineitem joined with the first ``k`` nations (``k`` from the rows asked for): every
rank produces its share, so it stays in parts. Each read is timed in two: ``execute`` (the query
runs and its FlightInfo comes back; the driver starts its streams) and ``fetch`` (the rows read to
the end), whose GB/s are the result's Arrow bytes over the fetch time. Every result is checked
against DuckDB by its row count and column sums.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from duckflock.config import Config
from duckflock.errors import DuckflockError
from duckflock.flightsql.server import FlightSqlServer
from duckflock.session import Session
from duckflock.testing.tables import oracle
from duckflock_bench.measure import GB, median, memcpy_gbps, timed

IN_PARTS, ONE = Config(serve_parts_min_bytes=0), Config(serve_parts_min_bytes=-1)
# Each way: its server's settings, and whether the parts are read by a connection each, in threads
# (ADBC's partitions), not by the one reader of a statement (which takes its endpoints in order).
WAYS = {
    "per-rank endpoints": (IN_PARTS, False),
    "per-rank endpoints, a reader per part": (IN_PARTS, True),
    "one endpoint": (ONE, False),
}
COLUMNS = ("l_orderkey", "l_partkey", "n_nationkey")


def large_query(data: Path, rows: int) -> str:
    """A query of at least ``rows`` rows (the smallest number of nations that gives them)."""
    ((per_nation,),) = oracle(data).sql("SELECT count(*) FROM lineitem").fetchall()
    nations = math.ceil(rows / per_nation)
    if nations > 25:
        raise DuckflockError(
            f"{rows:,} rows need a larger --sf ({per_nation:,} lineitem rows x 25 nations at most)"
        )
    return f"SELECT {', '.join(COLUMNS)} FROM lineitem, nation WHERE n_nationkey < {nations}"


def measure(session: Session, data: Path, rows: int, runs: int) -> dict:
    import adbc_driver_flightsql.dbapi as flightsql

    sql = large_query(data, rows)
    sums = f"SELECT count(*), {', '.join(f'sum({c})' for c in COLUMNS)} FROM ({sql})"
    (row,) = oracle(data).sql(sums).fetchall()
    expected = tuple(int(v) for v in row)
    servers = {c: FlightSqlServer("grpc+tcp://127.0.0.1:0", session, config=c) for c in (IN_PARTS, ONE)}
    times: dict[str, dict[str, list[float]]] = {w: {"execute": [], "fetch": []} for w in WAYS}
    shape: dict[str, dict] = {}
    memcpy = [memcpy_gbps()]
    try:
        for i in range(runs + 1):  # the first of each is a warm-up
            order = list(WAYS) if i % 2 == 0 else list(WAYS)[::-1]
            for way in order:
                config, in_threads = WAYS[way]
                uri = f"grpc://127.0.0.1:{servers[config].port}"
                execute_s, fetch_s, table = (_read_in_threads if in_threads else _read)(flightsql, uri, sql)
                got = (table.num_rows, *(int(pc.sum(table[c]).as_py()) for c in COLUMNS))
                shape[way] = {"rows": table.num_rows, "bytes": table.nbytes, "correct": got == expected}
                if i:
                    times[way]["execute"].append(execute_s)
                    times[way]["fetch"].append(fetch_s)
                del table
    finally:
        for server in servers.values():
            server.stop()
    memcpy.append(memcpy_gbps())
    ways = {}
    for way in WAYS:
        fetch_s = median(times[way]["fetch"])
        ways[way] = {
            **shape[way],
            "execute_s": median(times[way]["execute"]),
            "fetch_s": fetch_s,
            "fetch_gbps": shape[way]["bytes"] / fetch_s / GB,
        }
    return {"query": sql, "rows_asked": rows, "runs": runs, "memcpy_gbps": median(memcpy), "ways": ways}


def _read(flightsql, uri: str, sql: str) -> tuple[float, float, pa.Table]:
    with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        execute_s, _ = timed(lambda: cur.execute(sql))
        fetch_s, table = timed(cur.fetch_arrow_table)
    return execute_s, fetch_s, table


def _read_in_threads(flightsql, uri: str, sql: str) -> tuple[float, float, pa.Table]:
    with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        execute_s, (partitions, _) = timed(lambda: cur.adbc_execute_partitions(sql))

    def read(partition: bytes) -> pa.Table:
        with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.adbc_read_partition(partition)
            return cur.fetch_arrow_table()

    with ThreadPoolExecutor(len(partitions)) as pool:
        fetch_s, tables = timed(lambda: list(pool.map(read, partitions)))
    return execute_s, fetch_s, pa.concat_tables(tables)


def markdown(r: dict, ranks: int) -> list[str]:
    lines = [
        "",
        f"## A large result: {next(iter(r['ways'].values()))['rows']:,} rows through ADBC, {ranks} ranks",
        "",
        f"`{r['query']}`; median of {r['runs']} runs after a warm-up. memcpy in the same run: "
        f"**{r['memcpy_gbps']:.2f} GB/s**.",
        "",
        "| endpoints | Arrow GB | execute s | fetch s | fetch GB/s | of memcpy | correct |",
        "|---|---|---|---|---|---|---|",
    ]
    for way, w in r["ways"].items():
        lines.append(
            f"| {way} | {w['bytes'] / GB:.2f} | {w['execute_s']:.2f} | {w['fetch_s']:.2f} "
            f"| {w['fetch_gbps']:.2f} | {w['fetch_gbps'] / r['memcpy_gbps']:.0%} "
            f"| {'yes' if w['correct'] else '**NO**'} |"
        )
    return lines
