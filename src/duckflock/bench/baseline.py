"""Single-process DuckDB on the same Parquet files: the baseline, its peak memory, result comparison."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import duckdb
import pyarrow as pa

from duckflock.bench.measure import cores
from duckflock.catalog import Catalog
from duckflock.catalog.partitioning import quote_ident
from duckflock.sqltext import sql_literal
from duckflock.testing.compare import difference


def baseline_connection(
    data: str | os.PathLike[str], threads: int | None = None
) -> duckdb.DuckDBPyConnection:
    """A fresh DuckDB with every core (default) and a view per catalog table over all its files."""
    catalog = Catalog.load(data)
    con = duckdb.connect(config={"threads": threads or cores()})
    for name, info in catalog.tables.items():
        files = [str(catalog.path(f)) for p in info.partitions for f in p.files]
        if not files:
            continue
        listing = "[" + ", ".join(sql_literal(f) for f in files) + "]"
        reader = "read_csv" if info.format == "csv" else "read_parquet"
        con.execute(f"CREATE VIEW {quote_ident(name)} AS SELECT * FROM {reader}({listing})")
    return con


def same_result(got: pa.Table, expected: pa.Table, order_by: list[str]) -> bool:
    """Same schema, the same rows as multisets, and the same sequence of the ``order_by`` columns."""
    if got.schema != expected.schema or got.num_rows != expected.num_rows:
        return False
    for c in order_by:
        if not got.column(c).equals(expected.column(c)):
            return False
    keys = [(c, "ascending") for c in got.column_names]
    return got.sort_by(keys).equals(expected.sort_by(keys))


def same_or_close(got: pa.Table, expected: pa.Table, order_by: list[str]) -> bool:
    """Equal to DuckDB's result. Arrow's exact comparison first (fast); only when it fails the shared
    tolerant one (floats within 1e-9: a distributed sum adds in another order), which is slow on
    large results because it compares Python rows."""
    return same_result(got, expected, order_by) or difference(got, expected, order_by) is None


_PEAK_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from duckflock.bench.baseline import baseline_connection
    from duckflock.bench.measure import peak_rss_kb
    con = baseline_connection(sys.argv[1])
    t0 = time.perf_counter()
    rows = con.sql(sys.argv[2]).to_arrow_table().num_rows
    seconds = time.perf_counter() - t0
    peak = peak_rss_kb()
    print(json.dumps({"peak_kb": peak, "rows": rows, "seconds": seconds}))
    """
)


def duckdb_peak(data: str | os.PathLike[str], query: str, timeout: float = 900) -> dict[str, float]:
    """Peak RSS (KiB) of a fresh Python process running ``query`` once in single-process DuckDB.

    VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork + exec, so a child started by a big
    parent would report the parent's peak."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, str(data), query],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])
