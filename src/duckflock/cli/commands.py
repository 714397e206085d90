"""The sql, explain and load commands (sql and load run on every rank of an MPI job)."""

from __future__ import annotations

import argparse

from rich.console import Console

from duckflock.catalog import Catalog
from duckflock.cli.output import stdout_console
from duckflock.config import Config
from duckflock.errors import DuckflockError
from duckflock.exec.spmd import spmd

out = stdout_console()
err = Console(stderr=True, soft_wrap=True)


def run_sql(args: argparse.Namespace) -> int:
    """SPMD: rank 0 runs the query and prints; a failure anywhere ends every rank with exit 1."""
    from duckflock.cli.output import print_error, print_profile, print_table, write_result

    code = 0
    with spmd(args.data) as db:
        if db is not None:
            try:
                result = db.sql(args.query, profile=args.profile)
                if args.output:
                    write_result(result.arrow(), args.output)
                    out.print(f"wrote {result.arrow().num_rows} rows to {args.output}")
                else:
                    print_table(result.arrow(), max_rows=args.max_rows, console=out)
                out.print(f"{result.seconds:.3f} s on {db.ranks} ranks")
                if args.profile:
                    print_profile(result.stats, console=out)
            except DuckflockError as e:
                print_error(err, str(e))
                code = 1
    return code


def run_explain(args: argparse.Namespace) -> int:
    """Planning needs only the catalog: no ranks are started (unless --analyze runs the query)."""
    if args.analyze:
        with spmd(args.data) as db:
            if db is not None:
                out.print(db.explain(args.query, analyze=True), highlight=False, markup=False)
        return 0
    from duckflock.exec.driver import plan_query
    from duckflock.plan.explain import explain_plan
    from duckflock.sql.schema_db import SchemaDB

    catalog = Catalog.load(args.data)
    plan = plan_query(args.query, catalog, SchemaDB(catalog), args.ranks, Config.from_env())
    out.print(explain_plan(plan), highlight=False, markup=False)
    return 0


def run_load(args: argparse.Namespace) -> int:
    """SPMD: every rank loads its share; a failure on any rank fails all of them, and rank 0 prints
    one message naming the rank that failed."""
    from duckflock.exec.driver import describe_error
    from duckflock.exec.runtime import mpi_runtime
    from duckflock.ingest.load import load_table

    qid = 1
    rt = mpi_runtime(None, Config.from_env())
    code = 0
    try:
        keys = [k.strip() for k in args.partition_by.split(",")] if args.partition_by else None
        info = load_table(
            rt,
            qid,
            args.data,
            args.table,
            args.files,
            keys,
            args.partitions,
            args.scheme if keys else None,
            args.format,
        )
        if rt.rank == 0 and info is not None:
            on = f" on {', '.join(info.keys)}" if info.keys else ""
            out.print(
                f"loaded {info.name}: {info.rows} rows in {len(info.partitions)} partitions ({info.kind}{on})"
            )
    except Exception as e:
        code = 1
        failure = rt.mux.failure(qid)
        if failure is None:
            rt.mux.fail(qid, None, describe_error(e))
            rt.mux.flush(qid) if rt.size > 1 else None
            failure = rt.mux.failure(qid)
        if rt.rank == 0:
            from duckflock.cli.output import print_error

            print_error(err, str(failure.error() if failure else e))
    finally:
        rt.close()
    return code
