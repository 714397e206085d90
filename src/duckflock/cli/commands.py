"""The sql, explain and load commands (sql and load run on every rank of an MPI job)."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from rich.console import Console

from duckflock.catalog import Catalog
from duckflock.cli.output import stdout_console
from duckflock.config import Config
from duckflock.errors import DuckflockError
from duckflock.spmd import spmd

out = stdout_console()
err = Console(stderr=True, soft_wrap=True)


def _query(db, args: argparse.Namespace) -> int:
    """Run the command's query on a session and print or write its result."""
    from duckflock.cli.errors_out import print_error
    from duckflock.cli.output import print_profile, print_table

    try:
        if args.command == "explain":
            out.print(db.explain(args.query, analyze=args.analyze), highlight=False, markup=False)
            return 0
        result = db.sql(args.query, profile=args.profile, output=args.output)
        if args.output:
            out.print(f"wrote {result.outcome.rows_written} rows to {args.output}")
        else:
            print_table(result.arrow(), max_rows=args.max_rows, console=out)
        out.print(f"{result.seconds:.3f} s on {db.ranks} ranks")
        if args.profile:
            print_profile(result.stats, console=out)
    except DuckflockError as e:
        print_error(err, str(e))
        return 1
    return 0


def run_sql(args: argparse.Namespace) -> int:
    """SPMD: rank 0 runs the query and prints; a failure anywhere ends every rank with exit 1."""
    code = 0
    with spmd(args.data) as db:
        if db is not None:
            code = _query(db, args)
    return code


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
    workers = [w.strip() for w in args.workers.split(",") if w.strip()]
    config = {"shared_storage": args.shared_data}
    with duckflock.connect(
        workers=workers,
        token=read_token(args.token_file),
        tls_root_cert=read_pem(args.tls_root),
        config=config,
    ) as db:
        return _query(db, args)


def run_worker(args: argparse.Namespace) -> int:
    from duckflock.exec.worker import Worker

    if (args.tls_cert is None) != (args.tls_key is None):
        raise DuckflockError("--tls-cert and --tls-key go together")
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise DuckflockError(f"--listen wants HOST:PORT, got {args.listen!r}")
    tls = (read_pem(args.tls_cert), read_pem(args.tls_key)) if args.tls_cert else None
    scheme = "grpc+tls" if tls else "grpc+tcp"
    worker = Worker(
        f"{scheme}://{args.listen}",
        args.data,
        read_token(args.token_file),
        tls=tls,
        idle_timeout_s=args.idle_timeout,
    )
    out.print(
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
    from duckflock.plan.explain import explain_plan
    from duckflock.plan.planner import plan_query
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
            from duckflock.cli.errors_out import print_error

            print_error(err, str(failure.error() if failure else e))
    finally:
        rt.close()
    return code
