"""The ``duckflock bench ...`` command line: arguments only, so the CLI loads no benchmark code
(nor DuckDB or Arrow) until a benchmark runs."""

from __future__ import annotations

import argparse


def add_bench_parsers(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "bench",
        help="benchmarks: seed, exchange, split, TPC-H, scaling, lake, memory, Flight, netem, serve, model",
    )
    bsub = b.add_subparsers(dest="bench", required=True)
    bs = bsub.add_parser("seed", help="the seed report's join vs single-process DuckDB")
    bs.add_argument("--sf", default="0.1,0.5,1", help="scale factors, comma separated")
    bs.add_argument("--ranks", default="1,2,4", help="rank counts, comma separated")
    bs.add_argument("--runs", type=int, default=5, help="timed runs per point (median reported)")
    bs.add_argument("--data-root", default="data", help="where TPC-H data directories are kept")
    bs.add_argument("--out", default="bench-results/seed", help="output directory")
    bx = bsub.add_parser("exchange", help="all-to-all hash shuffle throughput vs memcpy")
    bx.add_argument("--ranks", default="2,4", help="rank counts, comma separated")
    bx.add_argument("--gb", type=float, default=2.0, help="GB shuffled in total per run")
    bx.add_argument("--runs", type=int, default=3, help="timed runs (median reported)")
    bx.add_argument("--out", default="bench-results/exchange", help="output directory")

    _add_split(bsub)
    _add_tpch(bsub)
    _add_scaling(bsub)
    _add_lake(bsub)

    _add_model(bsub)

    _add_serve(bsub)

    bm = bsub.add_parser("memory", help="peak memory vs DuckDB: in a memory cgroup (root), or without")
    bm.add_argument("--sf", type=float, default=1.0, help="scale factor (default 1)")
    bm.add_argument("--node-memory", default="1GiB", help="cgroup limit, e.g. 1.5GiB; none: no cgroup, Pss")
    bm.add_argument("--ranks", default="2,4", help="rank counts, comma separated")
    bm.add_argument("--runs", type=int, default=1, help="cold runs per point (median reported)")
    bm.add_argument("--queries", default="join,q9,q18,q21,skew", help="of join, q9, q18, q21, skew")
    bm.add_argument("--data-root", default="data", help="where TPC-H data directories are kept")
    bm.add_argument("--out", default="bench-results/memory", help="output directory")

    f = bsub.add_parser("flight", help="Flight workers on loopback vs MPI ranks vs DuckDB")
    f.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    f.add_argument("--workers", default="2,4", help="worker (and rank) counts, comma separated")
    f.add_argument("--runs", type=int, default=5, help="timed runs per query and system (median)")
    f.add_argument("--queries", default="seed,q3,q5,q9,q18", help="seed and/or qN, comma separated")
    f.add_argument("--data-root", default="data", help="where TPC-H data directories are kept")
    f.add_argument("--out", default="bench-results/flight", help="output directory")
    n = bsub.add_parser("netem", help="Flight workers on namespace hosts over shaped links")
    n.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    n.add_argument("--hosts", type=int, default=3, help="hosts (namespaces), one worker each")
    n.add_argument("--rates", default="1gbit,10gbit", help="link rates (tc syntax), comma separated")
    n.add_argument("--delay", default="0.2ms", help="one-way delay between hosts (needs sch_netem)")
    n.add_argument("--compression", default="none,lz4,zstd", help="wire compressions, comma separated")
    n.add_argument("--runs", type=int, default=3, help="timed runs per point (median)")
    n.add_argument("--queries", default="seed,q3,q9", help="seed and/or qN, comma separated")
    n.add_argument(
        "--shared-storage",
        action="store_true",
        help="let workers read small tables from the shared data directory instead of broadcasting "
        "them (default: off, like hosts with their own disks)",
    )
    n.add_argument("--data-root", default="data", help="where TPC-H data directories are kept")
    n.add_argument("--out", default="bench-results/netem", help="output directory")


def _add_tpch(bsub: argparse._SubParsersAction) -> None:
    bt = bsub.add_parser("tpch", help="the 22 TPC-H queries vs single-process DuckDB")
    bt.add_argument("--sf", type=float, default=1.0, help="scale factor (default 1)")
    bt.add_argument("--ranks", default="1,2,4", help="rank counts, comma separated")
    bt.add_argument("--runs", type=int, default=3, help="timed runs per query (median reported)")
    bt.add_argument("--check", action="store_true", help="compare every result with DuckDB's")
    bt.add_argument("--queries", default=None, help="only these query numbers, comma separated")
    bt.add_argument("--data-root", default="data", help="where TPC-H data directories are kept")
    bt.add_argument("--out", default="bench-results/tpch", help="output directory")


def _add_scaling(bsub: argparse._SubParsersAction) -> None:
    bc = bsub.add_parser("scaling", help="parallel efficiency: a core per rank vs DuckDB on one core")
    bc.add_argument("--sf", type=float, default=1.0, help="scale factor (default 1)")
    bc.add_argument("--ranks", default="1,2", help="rank counts, comma separated (a core each)")
    bc.add_argument("--runs", type=int, default=3, help="timed runs per query (median reported)")
    bc.add_argument("--queries", default=None, help="only these query numbers, comma separated")
    bc.add_argument("--data-root", default="data", help="where TPC-H data directories are kept")
    bc.add_argument("--out", default="bench-results/scaling", help="output directory")


def _add_lake(bsub: argparse._SubParsersAction) -> None:
    bl = bsub.add_parser("lake", help="TPC-H on an S3-compatible server (started here) vs local disk")
    bl.add_argument("--sf", type=float, default=1.0, help="scale factor (default 1)")
    bl.add_argument("--ranks", default="2", help="rank counts (the last: pushdown, exchange)")
    bl.add_argument("--runs", type=int, default=1, help="timed runs after a checked warm-up (median)")
    bl.add_argument("--queries", default=None, help="only these TPC-H query numbers, comma separated")
    bl.add_argument("--sections", default="tpch,pushdown,exchange", help="of tpch, pushdown, exchange")
    bl.add_argument(
        "--store",
        choices=("gofakes3", "moto"),
        default=None,
        help="the S3 server: gofakes3 (built with go on first use into .cache/) or moto's; default "
        "gofakes3 when it can be built, else moto",
    )
    bl.add_argument("--data-root", default="data", help="where TPC-H data directories are kept")
    bl.add_argument("--out", default="bench-results/lake", help="output directory")


def _add_serve(bsub: argparse._SubParsersAction) -> None:
    bv = bsub.add_parser("serve", help="TPC-H through duckflock serve (ADBC) vs the session in-process")
    bv.add_argument("--sf", type=float, default=1.0, help="scale factor (default 1)")
    bv.add_argument("--ranks", type=int, default=2, help="ranks, as threads (default 2)")
    bv.add_argument("--runs", type=int, default=3, help="timed runs per query and way (median reported)")
    bv.add_argument("--queries", default=None, help="only these query numbers, comma separated")
    bv.add_argument(
        "--large-rows",
        type=int,
        default=50_000_000,
        help="rows of the large result read from an endpoint per rank vs one (default 50M; 0: none)",
    )
    bv.add_argument("--large-runs", type=int, default=2, help="timed runs of the large result per way")
    bv.add_argument("--large-only", action="store_true", help="only the large result, no TPC-H queries")
    bv.add_argument("--data-root", default="data", help="where TPC-H data directories are kept")
    bv.add_argument("--out", default="bench-results/serve", help="output directory")


def _add_model(bsub: argparse._SubParsersAction) -> None:
    bc = bsub.add_parser("calibrate", help="measure the machine constants of the performance model")
    bc.add_argument("--rows", type=int, default=2_000_000, help="rows of the synthetic tables timed")
    bc.add_argument("--ranks", default="1,2,4", help="rank counts the per-query overhead is fitted on")
    bc.add_argument("--data-root", default="data", help="where TPC-H data directories are kept")
    bc.add_argument("--out", default="bench-results/calibrate", help="output directory (constants.json)")
    bm = bsub.add_parser("model", help="the performance model: validate it here, or project it to N nodes")
    bm.add_argument("--validate", action="store_true", help="measure and predict each query on --ranks")
    bm.add_argument(
        "--sf",
        default=None,
        help="with --validate: the scale factor measured (default 1); else those projected to, comma "
        "separated (default 100,1000)",
    )
    bm.add_argument("--ranks", default="1,2,4", help="with --validate: rank counts, comma separated")
    bm.add_argument("--queries", default="seed,q6,q3,q9,q18", help="with --validate: seed and/or qN")
    bm.add_argument("--runs", type=int, default=5, help="with --validate: profiled runs per point (fastest)")
    bm.add_argument("--nodes", default="16,64,256,1024", help="node counts projected to, comma separated")
    bm.add_argument("--network", default="100Gbit/s,25Gbit/s", help="bandwidths per node, comma separated")
    bm.add_argument("--cores-per-node", type=int, default=32, help="cores of a projected node (default 32)")
    bm.add_argument("--latency-us", type=float, default=10.0, help="per-message latency of the network")
    bm.add_argument(
        "--overhead-per-rank-ms", type=float, default=None, help="the driver's cost per node (else measured)"
    )
    bm.add_argument(
        "--constants",
        default="bench-results/calibrate/constants.json",
        help="the constants of `bench calibrate` (measured first if missing)",
    )
    bm.add_argument("--docs", default="docs", help="where the figures go")
    bm.add_argument("--data-root", default="data", help="where TPC-H data directories are kept")
    bm.add_argument("--out", default="bench-results/model", help="output directory")


def _add_split(bsub: argparse._SubParsersAction) -> None:
    bp = bsub.add_parser("split", help="split by target and encode, in one process, vs memcpy")
    bp.add_argument("--workloads", default="narrow,lineitem", help="of narrow, lineitem, comma separated")
    bp.add_argument("--targets", default="2,4,16,64", help="target counts, comma separated")
    bp.add_argument("--mb", type=float, default=64.0, help="MB of input per point")
    bp.add_argument("--runs", type=int, default=5, help="timed runs (median reported)")
    bp.add_argument("--per-batch", action="store_true", help="split one batch at a time, not a chunk's worth")
    bp.add_argument("--out", default="bench-results/split", help="output directory")
