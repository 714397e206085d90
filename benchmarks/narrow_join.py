"""The narrow-tuple shuffle join: r(k, rid) and s(k, rid), ``--rows`` rows each, k a permutation of
the row numbers, both tables hash-partitioned on rid so that both sides shuffle on k. Prints the
medians of ``--runs`` runs interleaved with single-process DuckDB over the same files, and each
rank's received bytes kept in memory and spilled (from ``--profile``'s counts).

    python benchmarks/narrow_join.py --data /tmp/narrow --rows 20000000 --ranks 2 --runs 3
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb

import duckflock
from duckflock.catalog.catalog import CATALOG_FILE
from duckflock.testing.tables import oracle
from duckflock_bench.measure import cores, median, timed

QUERY = "SELECT count(*), sum(r.rid + s.rid) FROM r JOIN s ON r.k = s.k"
# k = rid * M mod rows is a permutation of 0..rows-1 when M is prime to rows.
MULTIPLIERS = {"r": 1_000_003, "s": 7_919}


def generate(data: Path, rows: int, ranks: int) -> None:
    if (data / CATALOG_FILE).exists():
        return
    with tempfile.TemporaryDirectory() as raw:
        con = duckdb.connect()
        for table, m in MULTIPLIERS.items():
            assert rows % m != 0
            path = Path(raw) / f"{table}.parquet"
            con.execute(
                f"COPY (SELECT (range * {m}) % {rows} AS k, range AS rid FROM range({rows})) TO '{path}'"
            )
            subprocess.run(
                [
                    str(Path(sys.executable).parent / "duckflock"),
                    "load",
                    "--data",
                    str(data),
                    "--table",
                    table,
                    str(path),
                    "--partition-by",
                    "rid",
                    "--scheme",
                    "hash",
                    "--ranks",
                    str(ranks),
                ],
                check=True,
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--rows", type=int, default=20_000_000)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    data = Path(args.data)
    generate(data, args.rows, args.ranks)
    baseline = oracle(data, cores())
    want = baseline.sql(QUERY).fetchall()
    ours, theirs = [], []
    with duckflock.connect(str(data), ranks=args.ranks) as db:
        db.sql(QUERY)  # warm-up
        for _ in range(args.runs):
            s, got = timed(lambda: db.sql(QUERY))
            ours.append(s)
            theirs.append(timed(lambda: baseline.sql(QUERY).fetchall())[0])
            assert [tuple(r.values()) for r in got.arrow().to_pylist()] == want, got.arrow()
        profiled = db.sql(QUERY, profile=True)
    print(
        f"load {os.getloadavg()[0]:.1f}; {args.rows:,} rows each side, {args.ranks} ranks, {args.runs} runs"
    )
    print(
        f"duckflock {median(ours):.3f} s, DuckDB {median(theirs):.3f} s: {median(ours) / median(theirs):.2f}x"
    )
    for rank in range(args.ranks):
        mine = [s.exchange for s in profiled.stats if s.rank == rank]
        held = sum(getattr(e, "bytes_kept", 0) for e in mine)  # not counted before
        spilled = sum(e.bytes_spilled for e in mine)
        print(
            f"rank {rank}: received {sum(e.bytes_in for e in mine) / 1e6:.1f} MB, "
            f"kept in memory {held / 1e6:.1f} MB, spilled {spilled / 1e6:.1f} MB"
        )


if __name__ == "__main__":
    main()
