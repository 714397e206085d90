"""Text form of a stage plan: each stage with where it runs, its exchange and its operator tree."""

from __future__ import annotations

from duckflock.plan.nodes import Node
from duckflock.plan.stages import StagePlan


def _tree(node: Node, depth: int, lines: list[str]) -> None:
    lines.append("    " + "  " * depth + node.explain_line())
    for c in node.children:
        _tree(c, depth + 1, lines)


def explain_plan(plan: StagePlan) -> str:
    lines: list[str] = []
    for stage in plan.stages:
        where = "driver" if stage.on_driver else "all ranks"
        if stage.output is None:
            out = "result"
        else:
            target = f" {stage.output.target.describe()}" if stage.output.target is not None else ""
            out = f"{stage.output.kind}{target} -> x{stage.output.xid}"
        inputs = ", ".join(f"x{x}" for x in stage.inputs) or "tables"
        lines.append(f"Stage {stage.sid} on {where}: reads {inputs}; output {out}")
        _tree(stage.root, 0, lines)
    return "\n".join(lines)
