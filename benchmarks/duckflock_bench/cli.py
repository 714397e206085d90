"""``duckflock bench ...``: run a benchmark, write results.json / results.md / PNGs."""

from __future__ import annotations

import argparse
from pathlib import Path

from duckflock.errors import DuckflockError
from duckflock_bench.jobs import err
from duckflock_bench.measure import parse_list


def run(args: argparse.Namespace) -> int:
    """Exit code 0 when every point ran and gave the right answer; timings are never judged."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.bench == "seed":
        return _seed(args, out)
    if args.bench == "exchange":
        return _exchange(args, out)
    if args.bench == "split":
        return _split(args, out)
    if args.bench in ("flight", "netem"):
        from duckflock_bench.flight_bench import run as run_flight

        return run_flight(args)
    if args.bench == "tpch":
        from duckflock_bench.tpch_bench import run as run_tpch

        only = parse_list(args.queries, int) if args.queries else None
        return run_tpch(args.sf, _ranks(args.ranks), args.runs, args.check, args.data_root, out, only)
    if args.bench == "scaling":
        from duckflock_bench.scaling import run as run_scaling

        only = parse_list(args.queries, int) if args.queries else None
        return run_scaling(args.sf, _ranks(args.ranks), max(1, args.runs), args.data_root, out, only)
    if args.bench == "lake":
        from duckflock_bench.lake_bench import SECTIONS
        from duckflock_bench.lake_bench import run as run_lake

        sections = tuple(parse_list(args.sections, str))
        if not sections or set(sections) - set(SECTIONS):
            raise DuckflockError(f"--sections takes some of {', '.join(SECTIONS)}, not {args.sections!r}")
        only = parse_list(args.queries, int) if args.queries else None
        runs = max(1, args.runs)
        return run_lake(args.sf, _ranks(args.ranks), runs, args.data_root, out, only, sections, args.store)
    if args.bench == "memory":
        return _memory(args, out)
    if args.bench in ("calibrate", "model"):
        from duckflock_bench.model_cli import run as run_model

        return run_model(args, out)
    if args.bench == "serve":
        from duckflock_bench.serve_bench import run as run_serve

        return run_serve(args)
    raise DuckflockError(f"unknown benchmark {args.bench}")


def _memory(args: argparse.Namespace, out: Path) -> int:
    from duckflock_bench.memory_bench import memory_markdown, run_memory
    from duckflock_bench.report import print_markdown

    if args.runs < 1:
        raise DuckflockError("--runs must be at least 1")
    names = parse_list(args.queries, str)
    results = run_memory(args.sf, args.node_memory, _ranks(args.ranks), args.runs, names, args.data_root, out)
    md = memory_markdown(results)
    (out / "results.md").write_text(md)
    print_markdown(md)
    err.print(f"wrote {out / 'results.json'}, {out / 'results.md'}")
    points = results["points"]
    return 0 if points and all(p["ok"] and p.get("correct", True) for p in points) else 1


def _split(args: argparse.Namespace, out: Path) -> int:
    from duckflock_bench.report import print_markdown
    from duckflock_bench.split_bench import WORKLOADS, run_split, split_markdown

    workloads = parse_list(args.workloads, str)
    targets = parse_list(args.targets, int)
    if not workloads or set(workloads) - set(WORKLOADS):
        raise DuckflockError(f"--workloads takes some of {', '.join(WORKLOADS)}, not {args.workloads!r}")
    if not targets or min(targets) < 2 or max(targets) > 65535:
        raise DuckflockError(f"--targets needs counts from 2 to 65535, got {args.targets!r}")
    if args.runs < 1 or args.mb <= 0:
        raise DuckflockError("--runs must be at least 1 and --mb positive")
    md = split_markdown(run_split(workloads, targets, args.mb, args.runs, args.per_batch, out))
    (out / "results.md").write_text(md)
    print_markdown(md)
    err.print(f"wrote {out / 'results.json'}, {out / 'results.md'}")
    return 0


def _ranks(text: str) -> list[int]:
    ranks = parse_list(text, int)
    if not ranks or min(ranks) < 1:
        raise DuckflockError(f"--ranks needs positive rank counts, got {text!r}")
    return ranks


def _seed(args: argparse.Namespace, out: Path) -> int:
    from duckflock_bench.plots import seed_figures
    from duckflock_bench.report import print_markdown, seed_markdown
    from duckflock_bench.seed import run_seed

    sfs = parse_list(args.sf, float)
    if not sfs or min(sfs) <= 0:
        raise DuckflockError(f"--sf needs positive scale factors, got {args.sf!r}")
    if args.runs < 1:
        raise DuckflockError("--runs must be at least 1")
    results = run_seed(sfs, _ranks(args.ranks), args.runs, args.data_root, out)
    md = seed_markdown(results)
    (out / "results.md").write_text(md)
    figures = seed_figures(results, out)
    print_markdown(md)
    err.print(f"wrote {out / 'results.json'}, {out / 'results.md'}, " + ", ".join(str(f) for f in figures))
    points = [p for e in results["scale_factors"] for p in e["points"]]
    return 0 if points and not results["errors"] and all(p["correct"] for p in points) else 1


def _exchange(args: argparse.Namespace, out: Path) -> int:
    from duckflock_bench.exchange import run_exchange
    from duckflock_bench.plots import exchange_figures
    from duckflock_bench.report import exchange_markdown, print_markdown

    if args.gb <= 0:
        raise DuckflockError("--gb must be positive")
    if args.runs < 1:
        raise DuckflockError("--runs must be at least 1")
    ranks = _ranks(args.ranks)
    if min(ranks) < 2:
        raise DuckflockError("the exchange benchmark needs at least 2 ranks")
    results = run_exchange(ranks, args.gb, args.runs, out)
    md = exchange_markdown(results)
    (out / "results.md").write_text(md)
    figures = exchange_figures(results, out)
    print_markdown(md)
    err.print(f"wrote {out / 'results.json'}, {out / 'results.md'}, " + ", ".join(str(f) for f in figures))
    points = results["points"]
    return 0 if points and not results["errors"] and all(p["correct"] for p in points) else 1
