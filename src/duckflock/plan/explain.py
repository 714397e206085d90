"""Text form of a stage plan: each stage with where it runs, its exchange with the planner's estimate,
and its operator tree; with measured statistics (explain --analyze), the actual rows, bytes and times."""

from __future__ import annotations

from duckflock.exchange.kinds import ExchangeKind
from duckflock.exec.reports import summed
from duckflock.plan.nodes import Node
from duckflock.plan.stages import StagePlan
from duckflock.units import human


def _tree(node: Node, depth: int, lines: list[str]) -> None:
    lines.append("    " + "  " * depth + node.explain_line())
    for c in node.children:
        _tree(c, depth + 1, lines)


def explain_plan(plan: StagePlan, stats: list | None = None) -> str:
    lines = [f"Read at: {', '.join(plan.read_at)}"] if plan.read_at else []
    for stage in plan.stages:
        where = "driver" if stage.on_driver else "all ranks"
        if stage.once_per_process:  # exec/resources/fused.py
            where = "all ranks, once per process"
        if stage.output is None:
            out = "result"
        else:
            spec = stage.output
            target = f" {spec.target.describe()}" if spec.target is not None else ""
            if spec.fallback_target is not None:
                above = human(spec.fallback_above, "B")
                target += f", hash {spec.fallback_target.describe()} if over {above}"
            elif spec.kind is ExchangeKind.BROADCAST:
                target += " (any size: no shuffle gives the same rows)"
            if spec.skew is not None:  # plan/skew.py
                target += f", hot keys {spec.skew.describe} all ranks"
            order = " (in rank order)" if spec.ordered else ""
            rows, size = spec.est
            out = f"{spec.kind}{target}{order} -> x{spec.xid} [est. {human(rows)} rows, {human(size, 'B')}]"
        inputs = ", ".join(f"x{x}" for x in stage.inputs) or "tables"
        only = f" (only if {', '.join(f'x{x}' for x in stage.when)} hashed)" if stage.when else ""
        lines.append(f"Stage {stage.sid} on {where}{only}: reads {inputs}; output {out}")
        mine = sorted((s for s in stats or [] if s.sid == stage.sid), key=lambda s: s.rank)
        for s in mine:
            e = s.exchange
            lines.append(
                f"  actual rank {s.rank}: {1000 * s.total_s:.1f} ms (duckdb {1000 * s.compute_s:.1f} ms), "
                f"rows in {e.rows_in:,} out {e.rows_out:,}, bytes received {human(e.bytes_in, 'B')} "
                f"sent {human(e.bytes_out, 'B')}"
                + (f", kept in memory {human(e.bytes_kept, 'B')}" if e.bytes_kept else "")
                + (f", spilled {human(e.bytes_spilled, 'B')}" if e.bytes_spilled else "")
                + (f"; {s.note}" if s.note else "")
            )
            lines.extend(f"    scan {scan.describe()}" for scan in s.scans)
        lines.extend(f"  scans, all ranks: {scan.describe()}" for scan in summed([s.scans for s in mine]))
        _tree(stage.root, 0, lines)
    return "\n".join(lines)
