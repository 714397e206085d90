"""`duckflock` command: datagen | load | worker | serve | sql | explain | bench | demo.

Queries (sql, explain --analyze) started outside an MPI job run their ranks as threads of a child
process (exec/hosting/forked.py), or, with fewer ranks per process (DUCKFLOCK_RANKS_PER_PROCESS), re-launch
themselves under ``mpiexec``, as ``load`` does with a process per rank; under mpiexec or srun they
run SPMD with rank 0 as the driver.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys

from duckflock.cli.bench_args import add_bench_parsers
from duckflock.cli.serve import add_serve_parser
from duckflock.cli.terminal import launch_env
from duckflock.errors import DuckflockError
from duckflock.errors_out import print_error, print_warning
from duckflock.exec.hosting.forked import exit_child, fork_job, interrupted_exit_code, note_interrupt
from duckflock.exec.hosting.launch import (
    job_outcome,
    launcher_rank,
    mpiexec_job,
    owned_temp_dir,
    per_process,
    relay_without_banner,
    under_mpi,
)

OVERSUBSCRIBED = 4  # ranks per core above which `sql`, `load` and `explain --analyze` warn


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="duckflock", description="Distributed SQL over many DuckDB processes.")
    sub = p.add_subparsers(dest="command", required=True)
    _add_datagen(sub)
    _add_load(sub)
    _add_vacuum(sub)
    _add_worker(sub)
    add_serve_parser(sub)
    for name, text in (("sql", "run a query"), ("explain", "show the distributed plan of a query")):
        _add_query(sub.add_parser(name, help=text), name)
    add_bench_parsers(sub)
    _add_demo(sub)
    return p


def _add_datagen(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("datagen", help="generate benchmark data into a data directory")
    g.add_argument("benchmark", choices=["tpch"])
    g.add_argument("--sf", type=float, default=1.0, help="scale factor (default 1)")
    g.add_argument("--out", required=True, help="data directory to create")
    g.add_argument("--parts", type=int, default=12, help="partitions per large table (default 12)")
    g.add_argument("--jobs", type=int, default=None, help="parallel generator processes")


def _add_load(sub: argparse._SubParsersAction) -> None:
    ld = sub.add_parser("load", help="register Parquet/CSV files as a table, optionally repartitioned")
    ld.add_argument("--data", required=True, help="data directory")
    ld.add_argument("--table", default=None, help="table name")
    ld.add_argument("files", nargs="*", help="input files or glob patterns")
    ld.add_argument("--partition-by", default=None, help="key column(s), comma separated")
    ld.add_argument("--partitions", type=int, default=None, help="number of partitions (default 12)")
    ld.add_argument(
        "--output",
        default=None,
        help="with --partition-by: write the partitions as objects under s3://bucket/prefix/ "
        "(default: into the data directory)",
    )
    # No default here, so a scheme given without --partition-by can be refused rather than ignored.
    ld.add_argument(
        "--scheme", choices=["hash", "range"], default=None, help="with --partition-by (default hash)"
    )
    ld.add_argument(
        "--format",
        choices=["parquet", "csv", "delta", "iceberg"],
        default=None,
        help="delta: the one input is a Delta table's path; iceberg: give --iceberg-catalog/--iceberg-table",
    )
    ld.add_argument(
        "--hive-partitioning-key",
        default=None,
        help="register the files in place, hash-partitioned on this hive key=value column of their paths",
    )
    ld.add_argument("--version", type=int, default=None, help="Delta: the table version (default latest)")
    ld.add_argument("--iceberg-catalog", default=None, help="Iceberg: catalog URI (sqlite:///cat.db, ...)")
    ld.add_argument("--iceberg-catalog-name", default="default", help="Iceberg: the catalog's name")
    ld.add_argument("--iceberg-table", default=None, help="Iceberg: namespace.table")
    ld.add_argument("--snapshot", type=int, default=None, help="Iceberg: snapshot id (default current)")
    ld.add_argument("--ranks", type=int, default=2, help="ranks that load in parallel (default 2)")
    ld.add_argument(
        "--repartition",
        action="store_true",
        help="rewrite the hash-partitioned tables placed by another DuckDB's hash (or only --table) "
        "with this DuckDB's, so they join co-located again",
    )


def _add_vacuum(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser("vacuum", help="remove objects and staging files of killed loads that no table names")
    v.add_argument("--data", required=True, help="data directory")
    v.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    v.add_argument(
        "--exchange-uri",
        action="append",
        default=[],
        help="also remove the storage-exchange jobs under this directory or s3://bucket/prefix whose "
        "launcher was killed (no heartbeat for --older-than); repeatable",
    )
    v.add_argument(
        "--older-than",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="leave anything younger alone, and count a load on another host as running until its "
        "lease is this old (default 3600)",
    )


def _add_worker(sub: argparse._SubParsersAction) -> None:
    w = sub.add_parser("worker", help="serve queries over Arrow Flight (for sql --workers)")
    w.add_argument("--listen", default="127.0.0.1:8815", help="HOST:PORT to bind (default 127.0.0.1:8815)")
    w.add_argument("--data", required=True, help="this worker's data directory (shared or its own)")
    w.add_argument("--token-file", required=True, help="file holding the shared secret token")
    w.add_argument("--tls-cert", default=None, help="PEM certificate: serve TLS")
    w.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    w.add_argument(
        "--idle-timeout",
        type=float,
        default=600.0,
        help="end a session after this many seconds without a call from its caller (a running "
        "query's, without its heartbeat: at least 5 s)",
    )


def _add_query(s: argparse.ArgumentParser, name: str) -> None:
    """The options of ``sql`` and ``explain``: where the ranks are, the query, and their own."""
    s.add_argument("--data", default=None, help="data directory (ranks on this machine or MPI ranks)")
    s.add_argument("--ranks", type=int, default=2, help="number of ranks (default 2)")
    s.add_argument("--workers", default=None, help="HOST:PORT,HOST:PORT,...: run on duckflock workers")
    s.add_argument(
        "--transport",
        choices=["local", "storage"],
        default="local",
        help="local (default): ranks here as threads, MPI between processes; storage: rank processes "
        "that exchange only through objects at --exchange-uri",
    )
    s.add_argument(
        "--exchange-uri", default=None, help="with --transport storage: a directory or s3://bucket/prefix"
    )
    s.add_argument("--token-file", default=None, help="the workers' shared token (with --workers)")
    s.add_argument("--tls-root", default=None, help="PEM certificate to trust for TLS workers")
    s.add_argument(
        "--shared-data",
        action="store_true",
        help="with --workers: every worker can read every file (small tables are then read, not broadcast)",
    )
    s.add_argument("query", help="the SELECT statement")
    s.add_argument(
        "--at",
        action="append",
        default=[],
        metavar="TABLE=VERSION",
        help="read a Delta/Iceberg table at a version or snapshot id, or at a timestamp "
        "(t='2025-05-01 12:00:00'), as VERSION AS OF does; repeatable",
    )
    if name == "explain":
        s.add_argument("--analyze", action="store_true", help="run the query; show actual rows, bytes, times")
        s.add_argument(
            "--verbose",
            action="store_true",
            help="first the query after each rewrite pass of the planner (not with --analyze or --workers)",
        )
    if name == "sql":
        s.add_argument(
            "--output",
            default=None,
            help="write the result to .parquet/.csv/.arrow, or to DIR/ as Parquet parts written by "
            "every rank (part-<rank>-<seq>.parquet; in name order for a parallel ORDER BY)",
        )
        s.add_argument("--profile", action="store_true", help="per-rank, per-stage timings")
        s.add_argument("--max-rows", type=int, default=20, help="rows to print (default 20)")


def _add_demo(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("demo", help="generate TPC-H, run the seed join on several ranks, check it")
    d.add_argument("--sf", type=float, default=0.1)
    d.add_argument("--data", default=None, help="data directory (default data/tpch-sf<SF>)")
    d.add_argument("--ranks", type=int, default=4)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    try:
        code = _dispatch(args, argv)
    except DuckflockError as e:
        if launcher_rank() in (None, 0):  # one message per job, not one per rank
            print_error(str(e))
        code = 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = interrupted_exit_code()
    exit_child(code)  # a job's forked child ends here
    return code


def relaunch(ranks: int, configured: int, argv: list[str]) -> int:
    """Run this same command as an MPI job of ``ranks`` ranks, ``configured`` in each process (0:
    all in one), and return its exit code. A process killed by the OS is reported in one message
    naming its ranks, instead of MPICH's banner."""
    k = per_process(ranks, configured)
    job = owned_temp_dir("job")
    try:
        cmd, job_env = mpiexec_job(ranks, k, ["-m", "duckflock.cli.main", *argv], job_dir=job)
        # A process group of its own, ended with this process: an interrupted (Ctrl-C) or
        # terminated CLI left mpiexec and the ranks computing, owned by no one.
        proc = subprocess.Popen(
            cmd, env={**os.environ, **launch_env(), **job_env}, stdout=subprocess.PIPE, start_new_session=True
        )
        assert proc.stdout is not None
        # Both, as the forked child takes them: a shell starts a background job with SIGINT ignored.
        previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            banner = relay_without_banner(proc.stdout, sys.stdout.buffer)
            code = proc.wait()
        except BaseException:
            _end_group(proc)
            from duckflock.exec.resources.budget import remove_orphaned_spill_dirs

            remove_orphaned_spill_dirs()  # the ranks', which were killed with the group
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        death = job_outcome(job, code, banner, k)
    finally:
        shutil.rmtree(job, ignore_errors=True)
    if death is None:
        return code
    print_error(death)
    return code or 1


def _interrupt(signum: int, frame: object) -> None:
    note_interrupt(signum)
    raise KeyboardInterrupt  # SIGTERM (timeout, a scheduler) ends the job as Ctrl-C does


def _end_group(proc: subprocess.Popen) -> None:
    """Stop mpiexec and every process it started (its process group): politely, then not."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            if sig == signal.SIGKILL:
                return
        except subprocess.TimeoutExpired:
            continue
        # mpiexec is gone; what it started may not be: end the rest of the group too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return


def _check_load_args(args: argparse.Namespace) -> None:
    if args.repartition:
        if args.files or args.partition_by or args.partitions is not None or args.scheme or args.format:
            raise DuckflockError(
                "--repartition rewrites stored tables as they are partitioned: "
                "give no input files, --partition-by, --partitions, --scheme or --format"
            )
    elif args.format in ("delta", "iceberg"):
        _check_lake_args(args)
    elif args.version is not None or args.snapshot is not None or args.iceberg_table or args.iceberg_catalog:
        raise DuckflockError("--version is for --format delta, --snapshot and --iceberg-* for iceberg")
    elif not args.table or not args.files:
        raise DuckflockError("load needs --table and input files (or --repartition)")
    elif args.hive_partitioning_key and (args.partition_by or args.scheme):
        raise DuckflockError("--hive-partitioning-key registers the files in place: give no --partition-by")
    elif not (args.partition_by or args.hive_partitioning_key) and (
        args.scheme or args.partitions is not None
    ):
        raise DuckflockError("--scheme and --partitions need --partition-by: the key columns to partition by")
    if args.output and (args.repartition or not args.partition_by):
        raise DuckflockError(
            "load --output is where --partition-by writes the table: files registered in place stay "
            "where they are, and --repartition writes a table where it is"
        )
    if args.output:
        from duckflock.ingest.object_output import prefix_of

        prefix_of(args.output)  # an object prefix, or a message before any rank starts


def _check_lake_args(args: argparse.Namespace) -> None:
    if not args.table:
        raise DuckflockError(f"load --format {args.format} needs --table")
    if args.partition_by or args.scheme or args.hive_partitioning_key:
        raise DuckflockError(
            f"a {args.format} table is registered in place, partitioned as its metadata says: "
            "give no --partition-by, --scheme or --hive-partitioning-key"
        )
    if args.format == "delta" and (len(args.files) != 1 or args.snapshot is not None or args.iceberg_table):
        raise DuckflockError("load --format delta takes one input, the table's path (and --version N)")
    if args.format == "iceberg" and (args.files or args.version is not None):
        raise DuckflockError("load --format iceberg takes no input files: give --iceberg-table, --snapshot")
    if args.format == "iceberg" and not (args.iceberg_catalog and args.iceberg_table):
        raise DuckflockError("load --format iceberg needs --iceberg-catalog URI and --iceberg-table ns.table")


def _dispatch(args: argparse.Namespace, argv: list[str]) -> int:
    if args.command == "datagen":
        from duckflock.ingest.tpch import generate_tpch

        generate_tpch(args.sf, args.out, parts=args.parts, jobs=args.jobs, progress=True)
        return 0
    if args.command in ("vacuum", "worker"):
        from duckflock.cli.commands import run_vacuum, run_worker

        return (run_vacuum if args.command == "vacuum" else run_worker)(args)
    if args.command == "serve":
        from duckflock.cli.serve import run_serve

        return run_serve(args)
    if args.command in ("sql", "explain") and args.at:
        from duckflock.sql.time_travel import pin, versions_given

        args.query = pin(args.query, versions_given(args.at))
    if args.command == "explain" and args.verbose and (args.analyze or args.workers):
        raise DuckflockError(
            "explain --verbose shows how this process plans the query: not with --analyze or --workers"
        )
    if args.command in ("sql", "explain") and args.workers:
        from duckflock.cli.commands import run_on_workers

        # This process is the caller: SIGTERM cancels the query on the workers as Ctrl-C does, and
        # both are taken explicitly, as the other paths take them (a shell starts a background
        # job with SIGINT ignored, and Python then leaves it ignored).
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _interrupt)
        return run_on_workers(args)
    _check_args(args)
    if args.command in ("sql", "explain") and args.transport == "storage":
        from duckflock.cli.commands import run_on_storage

        return run_on_storage(args)
    needs_ranks = args.command in ("sql", "load") or (args.command == "explain" and args.analyze)
    if needs_ranks and not under_mpi():
        from duckflock.config import Config

        config = Config.from_env()  # a bad DUCKFLOCK_ setting fails here, once, not in every rank
        if args.command == "load":  # each rank process loads its share (cli/commands.run_load)
            _warn_if_oversubscribed(args.ranks)
            return relaunch(args.ranks, 1, argv)
        from duckflock.catalog import Catalog

        Catalog.load(args.data)  # fail fast, before starting any rank
        _warn_if_oversubscribed(args.ranks)
        if per_process(args.ranks, config.ranks_per_process) < args.ranks:
            return relaunch(args.ranks, config.ranks_per_process, argv)
        fork_job(args.ranks)  # all ranks in one child process, without MPI (exec/hosting/forked.py)
        from duckflock.cli.commands import run_in_threads

        return run_in_threads(args, config)
    return _run_here(args)


def _warn_if_oversubscribed(ranks: int) -> None:
    """Ranks on this machine far beyond its cores: each waits by polling, so say what they get."""
    cores = len(os.sched_getaffinity(0))
    if ranks > OVERSUBSCRIBED * cores:
        print_warning(
            f"{ranks} ranks on {cores} core{'' if cores == 1 else 's'}: each rank gets a fraction of a "
            "core (ranks busy-poll while they wait), so fewer ranks may well be faster"
        )


def _check_args(args: argparse.Namespace) -> None:
    if args.command in ("sql", "explain") and not args.data:
        raise DuckflockError(
            "give --data DIR (ranks here or MPI ranks) or --workers HOST:PORT,... (Flight workers)"
        )
    if args.command == "load":
        _check_load_args(args)
    if args.command in ("sql", "explain") and (args.transport == "storage") != bool(args.exchange_uri):
        raise DuckflockError("--transport storage and --exchange-uri go together")


def _run_here(args: argparse.Namespace) -> int:
    """A command run in this process (every rank of an MPI job runs it)."""
    if args.command == "sql":
        from duckflock.cli.commands import run_sql

        return run_sql(args)
    if args.command == "load":
        from duckflock.cli.commands import run_load

        return run_load(args)
    if args.command == "explain":
        from duckflock.cli.commands import run_explain

        return run_explain(args)
    if args.command == "bench":
        return _bench(args)
    if args.command == "demo":
        from duckflock.cli.demo import run_demo

        return run_demo(args)
    raise DuckflockError(f"unknown command {args.command}")


def _bench(args: argparse.Namespace) -> int:
    """The benchmarks are their own project (``benchmarks/`` of the source tree), not part of duckflock;
    checked before importing them, as matplotlib is only imported once a benchmark has run."""
    import importlib.util

    missing = [m for m in ("duckflock_bench", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        raise DuckflockError(
            f"duckflock bench needs the benchmarks project ({', '.join(missing)} not installed): "
            "pip install -e benchmarks, from a duckflock source checkout"
        )
    from duckflock_bench import cli as bench_cli

    return bench_cli.run(args)


if __name__ == "__main__":
    sys.exit(main())
