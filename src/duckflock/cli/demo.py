"""`duckflock demo`: TPC-H data, the seed report's join on several ranks, checked against DuckDB."""

from __future__ import annotations

import argparse
import time

import duckflock
from duckflock.cli.output import print_profile, stdout_console
from duckflock.testing.compare import same_result
from duckflock.testing.tables import oracle
from duckflock.testing.tpch import SEED_ORDER, SEED_QUERY

out = stdout_console()


def run_demo(args: argparse.Namespace) -> int:
    from duckflock.ingest.tpch import generate_tpch

    data = args.data or f"data/tpch-sf{args.sf:g}"
    out.rule(f"1. TPC-H at scale factor {args.sf:g} in {data}")
    catalog = generate_tpch(args.sf, data, progress=True)
    for name, info in sorted(catalog.tables.items()):
        how = f"{info.kind} on {', '.join(info.keys)}" if info.keys else info.kind
        out.print(f"  {name:9} {info.rows:>10,} rows  {len(info.partitions):>2} partitions  ({how})")

    out.rule(f"2. The seed report's join on {args.ranks} ranks")
    out.print(SEED_QUERY, highlight=False, markup=False)
    with duckflock.connect(data, ranks=args.ranks) as db:
        out.print(db.explain(SEED_QUERY), highlight=False, markup=False)
        db.sql(SEED_QUERY)  # warm-up: plan cache, file cache
        result = db.sql(SEED_QUERY, profile=True)
    result.show(max_rows=5, console=out)
    print_profile(result.stats, console=out)

    out.rule("3. Check against single-process DuckDB")
    con = oracle(data)
    t0 = time.perf_counter()
    want = con.sql(SEED_QUERY).to_arrow_table()
    single_s = time.perf_counter() - t0
    ok = same_result(result.arrow(), want, SEED_ORDER)
    verdict = "[green]identical[/]" if ok else "[red]DIFFERENT[/]"
    out.print(f"duckflock: {result.arrow().num_rows:,} rows in {result.seconds:.3f} s on {args.ranks} ranks")
    out.print(f"DuckDB:    {want.num_rows:,} rows in {single_s:.3f} s in one process")
    out.print(f"result: {verdict}")
    return 0 if ok else 1
