"""The peak memory of single-process DuckDB on the same files, measured in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

_PEAK_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from duckflock.testing.tables import oracle
    from duckflock_bench.measure import cores, peak_rss_kb
    con = oracle(sys.argv[1], cores())
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
