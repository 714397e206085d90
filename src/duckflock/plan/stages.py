"""Cut a physical plan at its exchanges into stages.

A stage is one DuckDB query per rank: its leaves are table scans and exchange reads, its output goes
to one exchange (or, for the final stage, to the user). Stages after a gather run on the driver only.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from duckflock.catalog.partitioning import Partitioning
from duckflock.plan.nodes import Exchange, ExchangeRead, Node


@dataclass(frozen=True)
class ExchangeSpec:
    xid: int  # equal to the id of the stage that produces it
    kind: str  # hash, range, broadcast, gather
    keys: tuple[str, ...]
    target: Partitioning | None
    producer: int  # stage id
    ordered: bool = False
    local: bool = False  # hash/range of a replicated input: each rank keeps its share, sends nothing
    est: tuple[float, float] = (0.0, 0.0)  # the planner's estimate of (rows, bytes)


@dataclass(frozen=True)
class Stage:
    sid: int
    root: Node
    inputs: tuple[int, ...]  # exchange ids read
    output: ExchangeSpec | None  # None: the final stage, whose result goes to the user
    on_driver: bool


@dataclass(frozen=True)
class StagePlan:
    stages: tuple[Stage, ...]  # in an order where producers come before consumers
    output_names: tuple[str, ...]
    output_schema: pa.Schema  # what single-process DuckDB returns for the query

    def stage(self, sid: int) -> Stage:
        return self.stages[sid]

    def exchange(self, xid: int) -> ExchangeSpec:
        for s in self.stages:
            if s.output is not None and s.output.xid == xid:
                return s.output
        raise KeyError(xid)

    def senders(self, xid: int, size: int) -> list[int]:
        producer = self.stage(self.exchange(xid).producer)
        return [0] if producer.on_driver else list(range(size))

    def receivers(self, xid: int, size: int) -> list[int]:
        return [0] if self.exchange(xid).kind == "gather" else list(range(size))


def cut(plan: Node, output_names: tuple[str, ...], output_schema: pa.Schema) -> StagePlan:
    stages: list[Stage] = []

    def build(root: Node, output_of: Exchange | None) -> int:
        inputs: list[int] = []

        def replace_exchanges(node: Node) -> Node:
            if isinstance(node, Exchange):
                child_sid = build(node.child, node)
                xid = stages[child_sid].output.xid  # type: ignore[union-attr]
                inputs.append(xid)
                return ExchangeRead(node.columns, xid=xid)
            children = tuple(replace_exchanges(c) for c in node.children)
            return node.with_children(children) if children != node.children else node

        new_root = replace_exchanges(root)
        on_driver = output_of is None or any(stages_by_x[x].kind == "gather" for x in inputs)
        sid = len(stages)
        spec = None
        if output_of is not None:
            ex = output_of
            spec = ExchangeSpec(
                sid, ex.kind, ex.keys, ex.target, sid, ordered=ex.ordered, est=ex.est, local=ex.local
            )
            stages_by_x[sid] = spec
        stages.append(Stage(sid, new_root, tuple(inputs), spec, on_driver))
        return sid

    stages_by_x: dict[int, ExchangeSpec] = {}
    build(plan, None)
    return StagePlan(tuple(stages), output_names, output_schema)
