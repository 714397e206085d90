"""Exchanges send only the columns something above them reads.

A column a filter below an exchange reads, and nothing above it, was sent anyway: TPC-H Q13's
LEFT JOIN condition ``o_comment NOT LIKE ...`` runs on the orders side before the shuffle, and
every order's comment crossed the network with it (69 of its 86 bytes a row); Q10 sent four join
keys already used. Top-down, each node's columns that its ancestors read are worked out; below an
exchange whose input carries others, a Project keeps only those, and the columns of the nodes
above that passed them on lose them too.

Conservative where a node's meaning depends on columns its expressions do not name: DISTINCT and
set operations compare whole rows, a correlated subquery or LATERAL join reads the input row, a
driver query runs the user's text, a positional sort key counts columns, and the two plans of an
AdaptiveJoin share their exchanges (cut once, by identity): below those everything is kept.
"""

from __future__ import annotations

import re
from dataclasses import replace

from duckflock.plan.nodes import (
    AdaptiveJoin,
    Aggregate,
    DriverQuery,
    Exchange,
    Filter,
    Join,
    Limit,
    Node,
    Project,
    Sort,
    Window,
    WithSubqueries,
    own_columns,
)
from duckflock.sqltext import quote_ident

# Nodes whose columns are their inputs' (a join's: both sides'), maybe with some of their own.
_PASSING = (Filter, Sort, Limit, Exchange, Window, Join)
_POSITIONAL = re.compile(r"\s*\d+(\s+(ASC|DESC))?(\s+NULLS\s+(FIRST|LAST))?\s*", re.IGNORECASE)


def prune(root: Node) -> Node:
    """``root`` with every exchange sending only the columns read above it."""
    return _visit(root, set(root.columns))


def _visit(node: Node, needed: set[str]) -> Node:
    if isinstance(node, AdaptiveJoin | DriverQuery) or not _named_only(node):
        return node
    if not needed & set(node.columns):  # count(*) reads none, but SQL selects one at least
        needed = needed | set(node.columns[:1])
    reads = own_columns(node)
    if _reads_rows_whole(node):
        wanted = {c for child in node.children for c in child.columns}
    elif isinstance(node, Project | Aggregate):
        wanted = reads
    elif isinstance(node, _PASSING):
        wanted = needed | reads
    else:  # DISTINCT, set operations, anything else: every input column counts
        wanted = {c for child in node.children for c in child.columns}
    subqueries = node.children[1:] if isinstance(node, Filter | Project) else ()
    children = tuple(
        _visit(c, set(c.columns) if any(c is s for s in subqueries) else wanted & set(c.columns))
        for c in node.children
    )
    if isinstance(node, Exchange):
        children = (_keep_only(children[0], needed | reads),)
    if all(new is old for new, old in zip(children, node.children, strict=True)):
        return node
    # The columns gone from its inputs are gone from a node that passed them on.
    before = {c for child in node.children for c in child.columns}
    gone = before - {c for child in children for c in child.columns}
    node = node.with_children(children)
    if isinstance(node, _PASSING) and gone & set(node.columns):
        node = replace(node, columns=tuple(c for c in node.columns if c not in gone))
    return node


def _reads_rows_whole(node: Node) -> bool:
    """Whether the node reads its input's columns beyond its own expressions: a correlated
    subquery's plan, or a LATERAL join's right side, names columns of the input row."""
    return (isinstance(node, WithSubqueries) and bool(node.correlated)) or (
        isinstance(node, Join) and node.lateral
    )


def _named_only(node: Node) -> bool:
    """Whether the node's expressions name columns only by name (no ORDER BY 2)."""
    return not (isinstance(node, Sort) and any(_POSITIONAL.fullmatch(k) for k in node.keys))


def _keep_only(child: Node, wanted: set[str]) -> Node:
    """``child``, under a Project of the columns in ``wanted`` where it has others (one at least)."""
    keep = tuple(c for c in child.columns if c in wanted) or child.columns[:1]
    if keep == child.columns:
        return child
    return Project(keep, child=child, exprs=tuple(quote_ident(c) for c in keep))
