"""Plan nodes. Every node outputs uniquely named columns; expressions are DuckDB SQL over those names.

Removing every Exchange leaves a valid single-node plan: exchanges only say where rows must be.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from duckflock.catalog.catalog import shown
from duckflock.catalog.partitioning import Partitioning
from duckflock.exchange.kinds import ExchangeKind
from duckflock.plan.kinds import AggPhase, JoinKind, JoinStrategy, SetOpKind, SkewRole


@dataclass(frozen=True, eq=False)
class Node:
    columns: tuple[str, ...]

    @property
    def children(self) -> tuple[Node, ...]:
        return ()

    def with_children(self, children: tuple[Node, ...]) -> Node:
        return self

    def explain_line(self) -> str:
        return type(self).__name__


@dataclass(frozen=True, eq=False)
class Unary(Node):
    child: Node = field(kw_only=True)

    @property
    def children(self) -> tuple[Node, ...]:
        return (self.child,)

    def with_children(self, children: tuple[Node, ...]) -> Node:
        return replace(self, child=children[0])


@dataclass(frozen=True, eq=False)
class Scan(Node):
    """Read a catalog table's partitions on this rank (all partitions when ``replicated``)."""

    table: str = ""
    source_columns: tuple[str, ...] = ()
    filter: str | None = None
    replicated: bool = False

    def explain_line(self) -> str:
        cols = ", ".join(self.source_columns)
        where = f" where {self.filter}" if self.filter else ""
        how = " (every rank reads all partitions)" if self.replicated else ""
        return f"Scan {shown(self.table)} [{cols}]{where}{how}"


@dataclass(frozen=True, eq=False)
class FunctionScan(Node):
    """A table function in FROM (range, generate_series, ...): deterministic, so every rank can
    evaluate it whole — a replicated relation."""

    function: str = ""  # SQL of the call
    source_columns: tuple[str, ...] = ()  # the function's column names

    def explain_line(self) -> str:
        return f"FunctionScan {self.function}"


@dataclass(frozen=True, eq=False)
class Values(Node):
    """A constant one-row relation (SELECT without FROM)."""

    def explain_line(self) -> str:
        return "Values (one row)"


@dataclass(frozen=True, eq=False)
class WithSubqueries(Unary):
    """A node whose expressions contain uncorrelated subqueries. Each subquery is planned on its own
    and referenced in the SQL by a token (``"__sq3"``); its rows must be on every rank that evaluates
    the expression (DuckDB then evaluates IN / NOT IN / EXISTS / scalar subqueries exactly)."""

    subqueries: tuple[tuple[str, Node], ...] = ()
    # Tokens of the correlated ones: their plan reads columns of this node's input row, so DuckDB
    # evaluates them inline, over inputs that are whole on every rank.
    correlated: tuple[str, ...] = ()

    @property
    def children(self) -> tuple[Node, ...]:
        return (self.child, *(n for _, n in self.subqueries))

    def with_children(self, children: tuple[Node, ...]) -> Node:
        subs = tuple((tok, n) for (tok, _), n in zip(self.subqueries, children[1:], strict=True))
        return replace(self, child=children[0], subqueries=subs)


@dataclass(frozen=True, eq=False)
class Filter(WithSubqueries):
    condition: str = ""

    def explain_line(self) -> str:
        return f"Filter {self.condition}"


@dataclass(frozen=True, eq=False)
class Project(WithSubqueries):
    exprs: tuple[str, ...] = ()

    def explain_line(self) -> str:
        shown = [e if e == f'"{c}"' else f"{e} AS {c}" for e, c in zip(self.exprs, self.columns, strict=True)]
        return "Project " + ", ".join(shown)


@dataclass(frozen=True, eq=False)
class Join(Node):
    left: Node = field(kw_only=True)
    right: Node = field(kw_only=True)
    kind: JoinKind = JoinKind.INNER
    # Equi-join keys as SQL over the left / right columns, pairwise.
    left_keys: tuple[str, ...] = ()
    right_keys: tuple[str, ...] = ()
    # Plain column names behind the keys (None where a key is an expression).
    left_key_cols: tuple[str | None, ...] = ()
    right_key_cols: tuple[str | None, ...] = ()
    # DuckDB types of the keys, pairwise, for hashing both sides alike.
    key_types: tuple[str, ...] = ()
    condition: str | None = None  # the full ON condition
    # The right side is a LATERAL subquery: it reads columns of the left row, so DuckDB evaluates
    # it per left row wherever that row is, over inputs that are whole there.
    lateral: bool = False
    strategy: JoinStrategy | None = None  # set by the distribution pass

    @property
    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)

    def with_children(self, children: tuple[Node, ...]) -> Node:
        return replace(self, left=children[0], right=children[1])

    def explain_line(self) -> str:
        on = f" on {self.condition}" if self.condition else ""
        how = f" [{self.strategy}]" if self.strategy else ""
        return f"Join {self.kind}{' lateral' if self.lateral else ''}{on}{how}"


# An integer, maybe in parentheses or negated: what DuckDB takes for a position in GROUP BY.
_POSITION = re.compile(r"[\s()+-]*\d+[\s()]*")


@dataclass(frozen=True, eq=False)
class Aggregate(Unary):
    groups: tuple[str, ...] = ()  # SQL of the group keys; output columns are groups then aggs
    aggs: tuple[str, ...] = ()  # SQL of the aggregate calls
    phase: AggPhase = AggPhase.SINGLE
    key_types: tuple[str, ...] = ()  # canonical hash types of the groups (to shuffle them reusably)
    arg_types: tuple[str, ...] = ()  # DuckDB type of each aggregate's first argument ("" if none)
    # GROUPING SETS as indices into ``groups`` (ROLLUP and CUBE written out); None: GROUP BY groups.
    grouping_sets: tuple[tuple[int, ...], ...] | None = None

    def explain_line(self) -> str:
        g = ", ".join(self.groups) or "()"
        if self.grouping_sets is not None:
            g = self.grouping_sets_sql()
        return f"Aggregate[{self.phase}] by {g}: {', '.join(self.aggs)}"

    def grouping_sets_sql(self) -> str:
        assert self.grouping_sets is not None
        keys = self.group_by_keys()
        sets = ", ".join("(" + ", ".join(keys[i] for i in s) + ")" for s in self.grouping_sets)
        return f"GROUPING SETS ({sets})"

    def group_by_sql(self) -> str:
        """What follows GROUP BY ("" for none)."""
        if self.grouping_sets is not None:
            return self.grouping_sets_sql()
        return ", ".join(self.group_by_keys())

    def group_by_keys(self) -> list[str]:
        """The groups as GROUP BY terms: DuckDB reads an integer there as a column position (a
        constant grouped on, as ``sum(DISTINCT 2)`` groups by 2 in its partial phase), so such a
        key becomes an expression of the same value and type."""
        return [f"({g} + 0)" if _POSITION.fullmatch(g) else g for g in self.groups]


@dataclass(frozen=True, eq=False)
class Window(Unary):
    """Window functions appended as columns; rows meet on one rank per PARTITION BY key."""

    exprs: tuple[str, ...] = ()
    # PARTITION BY keys shared by every window expression (SQL); empty: the whole input is one window.
    partition_keys: tuple[str, ...] = ()
    key_types: tuple[str, ...] = ()  # canonical hash types of the partition keys

    def explain_line(self) -> str:
        return f"Window {', '.join(self.exprs)}"


@dataclass(frozen=True, eq=False)
class SetOp(Node):
    """UNION / INTERSECT / EXCEPT (with or without ALL); columns are matched by position."""

    left: Node = field(kw_only=True)
    right: Node = field(kw_only=True)
    kind: SetOpKind = SetOpKind.UNION
    all: bool = False
    key_types: tuple[str, ...] = ()  # per column, for hashing both sides alike

    @property
    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)

    def with_children(self, children: tuple[Node, ...]) -> Node:
        return replace(self, left=children[0], right=children[1])

    def explain_line(self) -> str:
        return f"{self.kind.upper()}{' ALL' if self.all else ''}"


@dataclass(frozen=True, eq=False)
class Distinct(Unary):
    key_types: tuple[str, ...] = ()  # canonical hash types of all columns

    def explain_line(self) -> str:
        return "Distinct"


@dataclass(frozen=True, eq=False)
class Sort(Unary):
    keys: tuple[str, ...] = ()  # SQL with ASC/DESC and NULLS FIRST/LAST
    limit: int | None = None
    offset: int = 0
    # The input is each rank's rows sorted on ``keys``, in rank order: the driver merges these runs
    # (exec/stages/merge_runs.py) instead of sorting, where the keys allow.
    merge: bool = False

    def explain_line(self) -> str:
        lim = f" limit {self.limit}" if self.limit is not None else ""
        off = f" offset {self.offset}" if self.offset else ""
        what = "Merge sorted runs on" if self.merge else "Sort"
        return f"{what} {', '.join(self.keys)}{lim}{off}"


@dataclass(frozen=True, eq=False)
class Limit(Unary):
    limit: int | None = None
    offset: int = 0

    def explain_line(self) -> str:
        return f"Limit {self.limit} offset {self.offset}"


@dataclass(frozen=True, eq=False)
class Exchange(Unary):
    """Move rows so the parent sees ``target`` partitioning: hash, range, broadcast or gather."""

    kind: ExchangeKind = ExchangeKind.HASH
    target: Partitioning | None = None
    keys: tuple[str, ...] = ()  # SQL of the key expressions over the child's columns (hash, range, sort)
    ordered: bool = False  # gather: the driver concatenates the ranks' rows in rank order
    # The input is whole on every rank: each rank keeps its own share instead of sending copies.
    local: bool = False
    est: tuple[float, float] = (0.0, 0.0)  # the planner's estimate of (rows, bytes) moved
    # A broadcast measured before it is replicated: when all ranks' rows exceed ``fallback_above``
    # bytes they are hashed on these keys into this partitioning instead (see AdaptiveJoin).
    fallback_keys: tuple[str, ...] = ()
    fallback_target: Partitioning | None = None
    fallback_above: int = 0
    # A join's hash exchange for heavy-hitter keys (plan/skew.py): spread or replicate the rows of
    # the hot keys found at run time; ``skew_group`` pairs it with the other side's exchange.
    skew: SkewRole | None = None
    skew_group: str = ""
    # The input's rows are all on the driver (a single-partition table's): only the driver runs
    # the stage producing them, or every other rank would add, say, an aggregate of no rows.
    from_driver: bool = False

    def explain_line(self) -> str:
        what = self.target.describe() if self.target is not None else ""
        if self.fallback_target is not None:
            what += f", or hash {self.fallback_target.describe()} if over {self.fallback_above} bytes"
        if self.skew is not None:
            what += f", hot keys {self.skew.describe} all ranks"
        return f"Exchange {self.kind} {what}".rstrip()


@dataclass(frozen=True, eq=False)
class AdaptiveJoin(Node):
    """One join planned two ways, chosen at run time by the measured size of a broadcast side (the
    exchange ``measured``, found in both plans): ``broadcast`` while that side stays within the
    threshold, ``shuffle`` (both sides hashed on the join keys) once it does not. Stages that only
    the shuffle plan needs run only then; the output satisfies the partitionings of both plans."""

    broadcast: Node = field(kw_only=True)
    shuffle: Node = field(kw_only=True)
    measured: Node | None = None  # the adaptive Exchange, until the plan is cut into stages
    xid: int = -1  # that exchange's id, once cut

    @property
    def children(self) -> tuple[Node, ...]:
        return (self.broadcast, self.shuffle)

    def with_children(self, children: tuple[Node, ...]) -> Node:
        return replace(self, broadcast=children[0], shuffle=children[1])

    def explain_line(self) -> str:
        on = f" x{self.xid}" if self.xid >= 0 else ""
        return f"AdaptiveJoin: first plan if{on} is within its bound, else the second"


@dataclass(frozen=True, eq=False)
class DriverQuery(Node):
    """A query duckflock cannot distribute, answered exactly by DuckDB on the driver: the query's
    own text, with each catalog table it names bound to a child (the table's rows, whole on the
    driver). Used only for tables small enough to gather (Config.driver_fallback_bytes)."""

    sql: str = ""
    inputs: tuple[tuple[str, Node], ...] = ()  # (catalog table name, the table's rows)
    reason: str = ""  # why the query was not distributed, for the user
    construct: str = ""  # the name of what is not distributed (errors.NotDistributed.construct)

    @property
    def children(self) -> tuple[Node, ...]:
        return tuple(n for _, n in self.inputs)

    def with_children(self, children: tuple[Node, ...]) -> Node:
        return replace(self, inputs=tuple((t, n) for (t, _), n in zip(self.inputs, children, strict=True)))

    def explain_line(self) -> str:
        return f"DriverQuery: the whole query on the driver, not distributed: {self.reason}"


@dataclass(frozen=True, eq=False)
class ExchangeRead(Node):
    """A stage's input: the rows an exchange delivered to this rank."""

    xid: int = 0

    def explain_line(self) -> str:
        return f"ExchangeRead x{self.xid}"


def own_sql(node: Node) -> list[str]:
    """The SQL expressions a node itself evaluates (not its children's)."""
    if isinstance(node, Filter):
        return [node.condition]
    if isinstance(node, Project):
        return list(node.exprs)
    if isinstance(node, Aggregate):
        return [*node.groups, *node.aggs]
    if isinstance(node, Window):
        return [*node.exprs, *node.partition_keys]
    if isinstance(node, Join):
        return [node.condition or "", *node.left_keys, *node.right_keys]
    if isinstance(node, Sort):
        return list(node.keys)
    if isinstance(node, Scan):
        return [node.filter or ""]
    if isinstance(node, Exchange):
        return list(node.keys)
    return []


_QUOTED = re.compile(r'"((?:[^"]|"")+)"')


def own_columns(node: Node) -> set[str]:
    """Every column name a node's own expressions mention (not its children's)."""
    return {m.group(1).replace('""', '"') for sql in own_sql(node) for m in _QUOTED.finditer(sql)}


def referenced(node: Node) -> set[str]:
    """Every column name the subtree's expressions mention (plan columns are quoted identifiers)."""
    return {
        m.group(1).replace('""', '"') for n in walk(node) for sql in own_sql(n) for m in _QUOTED.finditer(sql)
    }


# Functions whose values differ between two runs of one query (a transaction's time included).
_VOLATILE = re.compile(
    r"\b(random|setseed|uuid|gen_random_uuid|uuidv4|uuidv7|nextval|currval|now|today|"
    r"current_timestamp|current_date|current_time|get_current_timestamp|get_current_time|"
    r"transaction_timestamp|localtimestamp|localtime|current_localtimestamp|current_localtime)\b",
    re.IGNORECASE,
)


def volatile(root: Node) -> bool:
    """Whether the subtree calls a function whose value may differ when it runs again."""
    texts = [t for n in walk(root) for t in own_sql(n)]
    texts += [n.function for n in walk(root) if isinstance(n, FunctionScan)]
    return any(_VOLATILE.search(t) for t in texts)


def walk(node: Node):
    yield node
    for c in node.children:
        yield from walk(c)


def transform_up(node: Node, fn) -> Node:
    """Rebuild the tree bottom-up, applying ``fn`` to every node after its children."""
    children = tuple(transform_up(c, fn) for c in node.children)
    if children != node.children:
        node = node.with_children(children)
    return fn(node)
