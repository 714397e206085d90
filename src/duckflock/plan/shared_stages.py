"""Stages that compute the same rows run once: a CTE read twice, or a subquery written twice
(TPC-H Q15's revenue view: the lineitem scan and its partial aggregate would run twice). Their
exchange is received once and read by each stage that needs it.

Two exchanges are the same when their subtrees are, up to the names the planner made up for
columns (``__a3``, ``__px5``: each copy of a subtree gets its own): the key below renames those in
order of appearance. The consumer of the second copy reads the first one's columns under its own
names. Not shared: an exchange with something volatile under it (two runs would differ, and DuckDB
runs each copy), a gather (small, and one may be the result's own), a measured broadcast or a
skewed join's side (decided at run time, per exchange)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from duckflock.exchange.kinds import ExchangeKind
from duckflock.plan.nodes import Exchange, ExchangeRead, Node, Project, volatile
from duckflock.sqltext import quote_ident

if TYPE_CHECKING:
    from duckflock.plan.stages import Stage

# A name the planner makes up: ``__`` + letters + a number, a whole identifier (not ``t.__a1``).
_MADE_UP = re.compile(r"(?<![\w.])__[a-z]+\d+(?![\w.])")


def key(node: Exchange) -> tuple | None:
    """What identifies the rows ``node`` sends, where another exchange may share them; None where
    none may."""
    if node.kind is ExchangeKind.GATHER or node.skew is not None or node.fallback_target is not None:
        return None
    if node.from_driver or volatile(node):
        return None
    names: dict[str, str] = {}

    def canonical(text: str) -> str:
        return _MADE_UP.sub(lambda m: names.setdefault(m.group(0), f"__n{len(names)}"), text)

    def of(value: object) -> object:
        if isinstance(value, Node):
            fields = dataclasses.fields(value)
            return (type(value).__name__, *(of(getattr(value, f.name)) for f in fields))
        if isinstance(value, tuple | list):
            return tuple(of(v) for v in value)
        return canonical(repr(value))

    return of(node)  # type: ignore[return-value]


class SameRows:
    """The exchanges cut so far whose rows a later one may share."""

    def __init__(self) -> None:
        self._seen: dict[tuple, tuple[Exchange, int]] = {}
        self.shared: set[int] = set()  # the ids of exchanges read more than once

    def read(self, node: Exchange, cut: Callable[[Exchange], int], shareable: bool) -> tuple[int, Node]:
        """The id of the exchange delivering ``node``'s rows (one cut before with the same rows, or
        ``cut(node)``), and the read of it that gives them under ``node``'s column names."""
        found = key(node) if shareable else None
        if found is not None and found in self._seen:
            first, xid = self._seen[found]
            self.shared.add(xid)
        else:
            first, xid = node, cut(node)
            if found is not None:
                self._seen[found] = node, xid
        read = ExchangeRead(first.columns, xid=xid)
        if first.columns == node.columns:
            return xid, read
        return xid, Project(node.columns, child=read, exprs=tuple(quote_ident(c) for c in first.columns))

    def mark(self, stages: list[Stage]) -> list[Stage]:
        """``stages`` with the exchanges read more than once marked so (ExchangeSpec.shared)."""
        marked = []
        for s in stages:
            if s.output is not None and s.output.xid in self.shared:
                s = replace(s, output=replace(s.output, shared=True))
            marked.append(s)
        return marked
