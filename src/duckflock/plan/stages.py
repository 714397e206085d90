"""Cut a physical plan at its exchanges into stages.

A stage is one DuckDB query per rank: its leaves are table scans and exchange reads, its output goes
to one exchange (or, for the final stage, to the user). Stages after a gather run on the driver only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pyarrow as pa

from duckflock.catalog import Catalog
from duckflock.catalog.partitioning import Partitioning
from duckflock.exchange.kinds import ExchangeKind
from duckflock.plan import shared_stages, skew
from duckflock.plan.kinds import SkewRole
from duckflock.plan.nodes import (
    AdaptiveJoin,
    DriverQuery,
    Exchange,
    Filter,
    Node,
    Project,
    Scan,
    walk,
)


@dataclass(frozen=True)
class ExchangeSpec:
    xid: int  # equal to the id of the stage that produces it
    kind: ExchangeKind
    keys: tuple[str, ...]
    target: Partitioning | None
    producer: int  # stage id
    ordered: bool = False
    local: bool = False  # hash/range of a replicated input: each rank keeps its share, sends nothing
    est: tuple[float, float] = (0.0, 0.0)  # the planner's estimate of (rows, bytes)
    # A measured broadcast: hashed on these keys into this partitioning when all ranks' rows
    # exceed ``fallback_above`` bytes (the plan reads it through an AdaptiveJoin). The planner's
    # threshold travels with the plan, so every rank compares the total with the same number.
    fallback_keys: tuple[str, ...] = ()
    fallback_target: Partitioning | None = None
    fallback_above: int = 0
    skew: SkewRole | None = None  # spread or replicate the rows of hot keys (plan/skew.py)
    skew_group: str = ""
    shared: bool = False  # read by several stages (plan/shared_stages.py)


@dataclass(frozen=True)
class Stage:
    sid: int
    root: Node
    inputs: tuple[int, ...]  # exchange ids read
    output: ExchangeSpec | None  # None: the final stage, whose result goes to the user
    on_driver: bool
    # Measured broadcasts that must all have fallen back to a shuffle for this stage to run: it
    # produces an input only the shuffle plan of an AdaptiveJoin reads.
    when: tuple[int, ...] = ()
    once_per_process: bool = False  # run once for all the ranks of a process (exec/resources/fused.py)

    def whole_table_bytes(self, catalog: Catalog) -> float:
        """The bytes every rank reads of the tables it reads whole (replicated scans)."""
        return self._scanned_bytes(catalog, whole_only=True)

    def _scanned_bytes(self, catalog: Catalog, whole_only: bool) -> float:
        scans = [n for n in walk(self.root) if isinstance(n, Scan) and (n.replicated or not whole_only)]
        return sum(catalog.table(n.table).scanned_bytes(n.source_columns) for n in scans)

    def runs_once_per_process(
        self, catalog: Catalog, min_bytes: int, per_process: int, scans_once: bool, returned: int | None
    ) -> bool:
        """Whether the stage runs once for all the ``per_process`` ranks of a process
        (exec/resources/fused.py): it reads tables only, one partitioned, and its output is spread anew by an
        exchange on which the ranks need not agree while it runs; and the copies of tables read
        whole that it saves (one per other rank) hold at least ``min_bytes``, or (``scans_once``)
        it is a scan that reads at least ``min_bytes``.

        ``returned``: the exchange whose rows the final stage returns as they are. Its rows are
        not spread anew: each rank writes those it produced to its own part file (``output=DIR/``),
        which would leave all of a process's rows in its first rank's part."""
        spec = self.output
        if spec is None or self.on_driver or self.inputs or spec.kind not in _SPREAD_ANEW:
            return False
        if spec.xid == returned:
            return False
        if spec.local or spec.ordered or spec.skew is not None or spec.fallback_target is not None:
            return False
        if not any(isinstance(n, Scan) and not n.replicated for n in walk(self.root)):
            return False
        whole = self.whole_table_bytes(catalog)
        if whole > 0 and whole * (per_process - 1) >= min_bytes:
            return True
        # A scan and nothing more, in a process of more ranks than cores: one DuckDB reading the
        # process's partitions holds one pipeline's buffers, where each rank's copy holds its own,
        # in the same time. With a core per rank, one thread splitting all rows by target is slower
        # than each rank splitting its own, and saves no memory worth it. Stages holding state
        # (joins, aggregates) gain nothing either: their ranks' states add up the same.
        if not scans_once or not all(isinstance(n, (Scan, Filter, Project)) for n in walk(self.root)):
            return False
        return self._scanned_bytes(catalog, whole_only=False) >= min_bytes


# Exchanges whose rows go where their values (or nothing) say, not where they were produced.
_SPREAD_ANEW = (ExchangeKind.HASH, ExchangeKind.RANGE, ExchangeKind.BROADCAST, ExchangeKind.GATHER)


@dataclass(frozen=True)
class OnDriver:
    """Why a query ran whole, single-process, on the driver instead of distributed."""

    construct: str  # what is not distributed yet, by name (errors.NotDistributed.construct)
    reason: str  # the refusal's message

    def describe(self) -> str:
        return f"ran on the driver, not distributed: {self.reason}"


@dataclass(frozen=True)
class StagePlan:
    stages: tuple[Stage, ...]  # in an order where producers come before consumers
    output_names: tuple[str, ...]
    output_schema: pa.Schema  # what single-process DuckDB returns for the query
    output_types: tuple[str, ...] = ()  # the result columns' DuckDB types (Python values follow them)
    query: str = ""  # the user's SQL, for an error's message: a stage's SQL is a rewrite of it
    read_at: tuple[str, ...] = ()  # the version each lake table is read at ("t: Delta version 5")

    def stage(self, sid: int) -> Stage:
        return self.stages[sid]

    @property
    def on_driver(self) -> OnDriver | None:
        """Why the query runs whole on the driver (sql/driver_fallback.py); None: it is distributed."""
        for s in self.stages:
            for node in walk(s.root):
                if isinstance(node, DriverQuery):
                    return OnDriver(node.construct, node.reason)
        return None

    def exchange(self, xid: int) -> ExchangeSpec:
        for s in self.stages:
            if s.output is not None and s.output.xid == xid:
                return s.output
        raise KeyError(xid)

    def senders(self, xid: int, size: int) -> list[int]:
        producer = self.stage(self.exchange(xid).producer)
        return [0] if producer.on_driver else list(range(size))

    def receivers(self, xid: int, size: int) -> list[int]:
        kind = self.exchange(xid).kind
        # A broadcast read only by stages the driver runs (their other input is there) goes there.
        readers = [s for s in self.stages if xid in s.inputs]
        to_driver = kind is ExchangeKind.BROADCAST and all(s.on_driver for s in readers)
        return [0] if kind is ExchangeKind.GATHER or to_driver else list(range(size))


def cut(plan: Node, output_names: tuple[str, ...], output_schema: pa.Schema) -> StagePlan:
    stages: list[Stage] = []
    stages_by_x: dict[int, ExchangeSpec] = {}
    when: list[int] = []  # the AdaptiveJoin shuffle plans being cut
    # Both plans of an AdaptiveJoin hold the same exchange objects: each is cut once (by id).
    shared: dict[int, int] = {}
    adaptive_depth = 0
    same = shared_stages.SameRows()  # exchanges cut so far whose rows another may share

    def build(root: Node, output_of: Exchange | None) -> int:
        inputs: list[int] = []

        def exchange(node: Exchange) -> int:
            if id(node) in shared:
                return shared[id(node)]
            output = stages[build(node.child, node)].output
            assert output is not None  # a stage built for an exchange produces it
            xid = output.xid
            if adaptive_depth:
                shared[id(node)] = xid
            return xid

        def replace_exchanges(node: Node) -> Node:
            nonlocal adaptive_depth
            if isinstance(node, AdaptiveJoin):
                adaptive_depth += 1
                # The measured side first: its size decides which stages the rest of the join needs.
                assert isinstance(node.measured, Exchange)
                xid = exchange(node.measured)
                first = replace_exchanges(node.broadcast)
                when.append(xid)
                second = replace_exchanges(node.shuffle)
                when.pop()
                adaptive_depth -= 1
                return replace(node, broadcast=first, shuffle=second, measured=None, xid=xid)
            if isinstance(node, Exchange):
                # Not within the plans of an AdaptiveJoin, of which only one runs.
                xid, read = same.read(node, exchange, shareable=not adaptive_depth)
                if xid not in inputs:
                    inputs.append(xid)
                return read
            cut_children = {i: replace_exchanges(node.children[i]) for i in skew.child_order(node)}
            children = tuple(cut_children[i] for i in range(len(node.children)))
            return node.with_children(children) if children != node.children else node

        new_root = replace_exchanges(root)
        gathered = any(stages_by_x[x].kind is ExchangeKind.GATHER for x in inputs)
        on_driver = output_of is None or output_of.from_driver or gathered
        sid = len(stages)
        spec = None
        if output_of is not None:
            ex = output_of
            spec = ExchangeSpec(
                sid,
                ex.kind,
                ex.keys,
                ex.target,
                sid,
                ordered=ex.ordered,
                est=ex.est,
                local=ex.local,
                fallback_keys=ex.fallback_keys,
                fallback_target=ex.fallback_target,
                fallback_above=ex.fallback_above,
                skew=ex.skew,
                skew_group=ex.skew_group,
            )
            stages_by_x[sid] = spec
        stages.append(Stage(sid, new_root, tuple(inputs), spec, on_driver, tuple(when)))
        return sid

    build(plan, None)
    return StagePlan(tuple(skew.unmark_misordered(same.mark(stages))), output_names, output_schema)
