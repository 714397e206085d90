"""`duckflock demo`: TPC-H data, the seed report's join on several ranks, checked against DuckDB."""

from __future__ import annotations

import argparse
import time

import duckdb
import pyarrow as pa

import duckflock
from duckflock.catalog import Catalog
from duckflock.catalog.partitioning import quote_ident as q
from duckflock.cli.output import print_profile, print_table, stdout_console
from duckflock.sql.seed import SEED_QUERY

out = stdout_console()


def single_process(catalog: Catalog) -> duckdb.DuckDBPyConnection:
    """One DuckDB over every file of the data directory: the reference answer."""
    con = duckdb.connect()
    for name, info in catalog.tables.items():
        files = ", ".join(f"'{catalog.path(f)}'" for p in info.partitions for f in p.files)
        con.execute(f"CREATE VIEW {q(name)} AS SELECT * FROM read_parquet([{files}])")
    return con


def same_result(got: pa.Table, want: pa.Table, order_column: str) -> bool:
    """Same rows (as multisets) and the same sequence of the ORDER BY column."""
    if got.schema != want.schema or got.num_rows != want.num_rows:
        return False
    keys = [(n, "ascending") for n in got.column_names]
    same_rows = got.sort_by(keys).equals(want.sort_by(keys))
    return same_rows and got.column(order_column).equals(want.column(order_column))


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
    print_table(result.arrow(), max_rows=5, console=out)
    print_profile(result.stats, console=out)

    out.rule("3. Check against single-process DuckDB")
    con = single_process(catalog)
    t0 = time.perf_counter()
    want = con.sql(SEED_QUERY).to_arrow_table()
    single_s = time.perf_counter() - t0
    ok = same_result(result.arrow(), want, "o_orderdate")
    verdict = "[green]identical[/]" if ok else "[red]DIFFERENT[/]"
    out.print(f"duckflock: {result.arrow().num_rows:,} rows in {result.seconds:.3f} s on {args.ranks} ranks")
    out.print(f"DuckDB:    {want.num_rows:,} rows in {single_s:.3f} s in one process")
    out.print(f"result: {verdict}")
    return 0 if ok else 1
