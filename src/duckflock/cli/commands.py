"""The sql, explain and load commands (sql and load run on every rank of an MPI job)."""

from __future__ import annotations

import argparse
import contextlib
import functools
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from duckflock.catalog import Catalog, TableInfo
from duckflock.config import Config
from duckflock.errors import DuckflockError
from duckflock.spmd import spmd

if TYPE_CHECKING:
    from rich.console import Console

    from duckflock.exec.resources.runtime import Runtime


@functools.cache
def _out() -> Console:
    """The console results are printed on. rich is imported only by the rank that prints (rank 0):
    every other rank is spared its memory."""
    from duckflock.cli.output import stdout_console

    return stdout_console()


def _query(db, args: argparse.Namespace, on: str = "rank") -> int:
    """Run the command's query on a session and print or write its result; ``on``: what the
    session's ranks are (ranks, or Flight workers), for the timing line."""
    from duckflock.cli.output import print_profile
    from duckflock.errors_out import print_error

    try:
        if args.command == "explain":
            _out().print(db.explain(args.query, analyze=args.analyze), highlight=False, markup=False)
            return 0
        result = _run_query(db, args)
        if args.output:
            _out().print(f"wrote {result.outcome.rows_written} rows to {args.output}")
        else:
            result.show(max_rows=args.max_rows, console=_out())
        _out().print(f"{result.seconds:.3f} s on {db.ranks} {on}{'' if db.ranks == 1 else 's'}")
        if args.profile:
            for read_at in result.outcome.plan.read_at:  # the version each lake table was read at
                _out().print(f"read at {read_at}", highlight=False, markup=False)
            print_profile(result.stats, console=_out(), on_driver=result.on_driver)
    except DuckflockError as e:
        print_error(str(e))
        return 1
    return 0


def _run_query(db, args: argparse.Namespace):
    """The query's result; on a terminal with a live progress line while it runs."""
    from duckflock.cli.progress import ProgressDisplay, terminal_console

    console = terminal_console()
    if console is None:
        return db.sql(args.query, profile=args.profile, output=args.output)
    with ProgressDisplay(console) as display:
        return db.sql(args.query, profile=args.profile, progress=display, output=args.output)


def run_sql(args: argparse.Namespace) -> int:
    """SPMD: rank 0 runs the query and prints; a failure anywhere ends every rank with exit 1."""
    code = 0
    with spmd(args.data) as db:
        if db is not None:
            code = _query(db, args)
    return code


def run_in_threads(args: argparse.Namespace, config: Config) -> int:
    """The command's query on ``args.ranks`` ranks as threads of this process."""
    from duckflock.backends.threads import ThreadsBackend
    from duckflock.session import Session

    with Session(ThreadsBackend(args.data, args.ranks, config, fatal_exits=True)) as db:
        return _query(db, args)


def read_token(path: str) -> str:
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise DuckflockError(f"cannot read token file {path}: {e.strerror}") from None
    if len(token) < 16:
        raise DuckflockError(f"the token in {path} is too short (use at least 16 characters)")
    return token


def read_pem(path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise DuckflockError(f"cannot read {path}: {e.strerror}") from None


def run_on_workers(args: argparse.Namespace) -> int:
    """sql / explain on running Flight workers; this process is the caller and gets the result."""
    import duckflock

    if not args.token_file:
        raise DuckflockError("--workers needs --token-file")
    if args.data:
        raise DuckflockError(
            "--data does not go with --workers: each worker reads the data directory it was started "
            "with (duckflock worker --data DIR)"
        )
    workers = [w.strip() for w in args.workers.split(",") if w.strip()]
    config = {"shared_storage": args.shared_data}
    with duckflock.connect(
        workers=workers,
        token=read_token(args.token_file),
        tls_root_cert=read_pem(args.tls_root),
        config=config,
    ) as db:
        return _query(db, args, on="worker")


def run_on_storage(args: argparse.Namespace) -> int:
    """sql / explain on rank processes that exchange through the exchange URI only (a session of
    them, as from Python); this process is the caller and gets the result."""
    import duckflock

    if args.command == "explain" and not args.analyze:
        return run_explain(args)  # planning starts no ranks
    config = {"exchange_uri": args.exchange_uri}
    with duckflock.connect(args.data, ranks=args.ranks, transport="storage", config=config) as db:
        return _query(db, args)


def run_worker(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from duckflock.cli.listen import check_listen
    from duckflock.exec.hosting.worker import Worker

    if (args.tls_cert is None) != (args.tls_key is None):
        raise DuckflockError("--tls-cert and --tls-key go together")
    host, _ = check_listen(args.listen)
    cert, key = read_pem(args.tls_cert), read_pem(args.tls_key)
    tls = (cert, key) if cert is not None and key is not None else None
    scheme = "grpc+tls" if tls else "grpc+tcp"
    try:
        worker = Worker(
            f"{scheme}://{args.listen}",
            args.data,
            read_token(args.token_file),
            tls=tls,
            idle_timeout_s=args.idle_timeout,
        )
    except pa.ArrowException as e:  # e.g. the port taken since check_listen tried it
        raise DuckflockError(f"cannot listen on {args.listen}: {e}") from None
    _out().print(
        f"duckflock worker serving {args.data} on {scheme}://{host}:{worker.port}",
        highlight=False,
        soft_wrap=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        worker.serve()
    return 0


def run_explain(args: argparse.Namespace) -> int:
    """Planning needs only the catalog: no ranks are started (unless --analyze runs the query)."""
    if args.analyze:
        code = 0
        with spmd(args.data) as db:
            if db is not None:
                code = _query(db, args)
        return code
    from duckflock.exec.hosting.launch import per_process
    from duckflock.exec.resources.budget import with_derived_limits
    from duckflock.plan.explain import explain_plan
    from duckflock.plan.planner import plan_query
    from duckflock.sql.passes import Step, format_trace
    from duckflock.sql.schema_db import SchemaDB

    catalog = Catalog.load(args.data)
    config = with_derived_limits(Config.from_env(), args.ranks)  # as the ranks on this node would
    k = per_process(args.ranks, config.ranks_per_process)
    trace: list[Step] | None = [] if args.verbose else None
    plan = plan_query(args.query, catalog, SchemaDB(catalog), args.ranks, config, k, trace=trace)
    if trace is not None:
        _out().print(format_trace(trace), highlight=False, markup=False)
    _out().print(explain_plan(plan), highlight=False, markup=False)
    return 0


def run_vacuum(args: argparse.Namespace) -> int:
    from duckflock.ingest.vacuum import vacuum

    found = vacuum(args.data, args.older_than, dry_run=args.dry_run, exchanges=args.exchange_uri)
    out = _out()
    for why in found.skipped:
        out.print(f"skipped {why}", highlight=False, markup=False)
    verb = "would remove" if args.dry_run else "removed"
    for line in found.lines():
        out.print(f"{verb} {line}", highlight=False, markup=False)
    counts = f"{len(found.objects)} objects, {len(found.paths)} local files, {len(found.jobs)} exchange jobs"
    out.print(f"{verb} {counts}", highlight=False)
    return 0


def run_load(args: argparse.Namespace) -> int:
    """SPMD: every rank loads its share; a failure on any rank fails all of them, and rank 0 prints
    one message naming the rank that failed. With --repartition every stale hash table is rewritten,
    each as a load of its own."""
    from duckflock.exec.control.rank_query import describe_error
    from duckflock.exec.resources.runtime import mpi_runtimes
    from duckflock.ingest.load import load_table, repartition_table

    qid = 1
    # One rank per process, whatever DUCKFLOCK_RANKS_PER_PROCESS says: each loads its share.
    (rt,) = mpi_runtimes(None, replace(Config.from_env(), ranks_per_process=1))
    code = 0
    try:
        if args.repartition:
            for qid, name in enumerate(_tables_to_repartition(args, rt.rank), start=1):
                _print_loaded("repartitioned", repartition_table(rt, qid, args.data, name))
        elif args.format in ("delta", "iceberg"):
            _print_loaded("loaded", _load_lake(rt, qid, args))
        else:
            keys = [k.strip() for k in args.partition_by.split(",")] if args.partition_by else None
            info = load_table(
                rt,
                qid,
                args.data,
                args.table,
                args.files,
                keys,
                args.partitions,
                args.scheme,
                args.format,
                args.hive_partitioning_key,
                args.output,
            )
            _print_loaded("loaded", info)
    except Exception as e:
        code = 1
        error = rt.mux.report_failure(qid, None, describe_error(e))
        if rt.size > 1:
            rt.mux.flush(qid)
        if rt.rank == 0:
            from duckflock.errors_out import print_error

            print_error(str(error))
    finally:
        rt.close()
    return code


def _load_lake(rt: Runtime, qid: int, args: argparse.Namespace) -> TableInfo | None:
    """A Delta or Iceberg table registered in place (ingest/delta.py, ingest/iceberg.py)."""
    if args.format == "delta":
        from duckflock.ingest.delta import load_delta

        return load_delta(rt, qid, args.data, args.table, args.files[0], args.version, args.partitions)
    from duckflock.ingest.iceberg import load_iceberg

    return load_iceberg(
        rt,
        qid,
        args.data,
        args.table,
        args.iceberg_catalog,
        args.iceberg_table,
        args.snapshot,
        args.partitions,
        args.iceberg_catalog_name,
    )


def _tables_to_repartition(args: argparse.Namespace, rank: int) -> list[str]:
    """--table, or every hash table placed by a hash() other than this DuckDB's. Every rank reads the
    same catalog, so all ranks agree on the list."""
    import duckdb

    from duckflock.ingest.load import stale_hash_tables

    catalog = Catalog.load(args.data)
    names = [catalog.table(args.table).name] if args.table else stale_hash_tables(catalog)
    if not names and rank == 0:
        _out().print(f"every hash-partitioned table already matches DuckDB {duckdb.__version__}'s hash")
    return names


def _print_loaded(verb: str, info: TableInfo | None) -> None:
    """Rank 0's line about a table it loaded (other ranks get None)."""
    if info is None:
        return
    on = f" on {', '.join(info.keys)}" if info.keys else ""
    _out().print(
        f"{verb} {info.name}: {info.rows} rows in {len(info.partitions)} partitions ({info.kind}{on})"
    )
