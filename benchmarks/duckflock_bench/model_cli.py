"""``duckflock bench calibrate`` and ``duckflock bench model``: the commands around the performance
model (calibrate.py, model.py, model_bench.py, model_project.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from duckflock.errors import DuckflockError
from duckflock_bench.jobs import err, read_json, write_json
from duckflock_bench.measure import parse_list
from duckflock_bench.report import print_markdown


def run(args: argparse.Namespace, out: Path) -> int:
    from duckflock_bench.calibrate import calibrate

    if args.bench == "calibrate":
        ranks = parse_list(args.ranks, int)
        if args.rows < 1000 or not ranks or min(ranks) < 1:
            raise DuckflockError("--rows must be at least 1000 and --ranks positive rank counts")
        result = calibrate(out, args.data_root, args.rows, tuple(ranks))
        print_markdown(constants_markdown(result))
        err.print(f"wrote {out / 'constants.json'}")
        return 0
    path = Path(args.constants)
    if not path.is_file():
        err.print(f"no constants at {path}: calibrating first")
        calibrate(path.parent, args.data_root)
    calibration = read_json(path)
    docs = Path(args.docs)
    if args.validate:
        return _validate(args, calibration, out, docs)
    return _project(args, calibration, out, docs)


def constants_markdown(result: dict) -> str:
    lines = [
        f"## Machine constants (load average {result['load_average_at_start']} at the start)",
        "",
        "| constant | value |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {v:.4g} |" for k, v in result["constants"].items()]
    return "\n".join(lines) + "\n"


def _validate(args: argparse.Namespace, calibration: dict, out: Path, docs: Path) -> int:
    from duckflock_bench.model_bench import query_sql, validate, validation_markdown
    from duckflock_bench.model_project import validation_figure

    sfs = parse_list(args.sf or "1", float)
    if len(sfs) != 1 or sfs[0] <= 0:
        raise DuckflockError(f"--validate measures one positive scale factor, not --sf {args.sf}")
    sf = sfs[0]
    names = parse_list(args.queries, str)
    for name in names:
        query_sql(name)  # an unknown name fails here, before any session starts
    ranks = parse_list(args.ranks, int)
    if not ranks or min(ranks) < 1 or args.runs < 1:
        raise DuckflockError("--ranks needs positive rank counts and --runs at least 1")
    v = validate(calibration["constants"], sf, ranks, names, args.runs, args.data_root)
    v["calibration"] = calibration
    write_json(out / "validation.json", v)
    md = constants_markdown(calibration) + "\n" + validation_markdown(v)
    (out / "validation.md").write_text(md)
    figure = validation_figure(v, docs)
    print_markdown(md)
    err.print(f"wrote {out / 'validation.json'}, {out / 'validation.md'}, {figure}")
    return 0


def _project(args: argparse.Namespace, calibration: dict, out: Path, docs: Path) -> int:
    from duckflock_bench.model_project import projection_figures, projection_markdown, run_projection

    measured = out / "validation.json"
    if not measured.is_file():
        raise DuckflockError(f"no measured counts at {measured}: run `bench model --validate` first")
    sfs = parse_list(args.sf or "100,1000", float)
    nodes = parse_list(args.nodes, int)
    if not sfs or min(sfs) <= 0 or not nodes or min(nodes) < 1:
        raise DuckflockError("--sf and --nodes need positive values")
    consts = dict(calibration["constants"])
    if args.overhead_per_rank_ms is not None:
        consts["overhead_per_rank_s"] = args.overhead_per_rank_ms / 1e3
    proj = run_projection(
        read_json(measured),
        consts,
        nodes,
        parse_list(args.network, str),
        sfs,
        args.cores_per_node,
        args.latency_us * 1e-6,
    )
    write_json(out / "projection.json", proj)
    md = projection_markdown(proj)
    (out / "projection.md").write_text(md)
    figures = projection_figures(proj, docs)
    print_markdown(md)
    err.print(f"wrote {out / 'projection.json'}, {out / 'projection.md'}, " + ", ".join(map(str, figures)))
    return 0
