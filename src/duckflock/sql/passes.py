"""The rewrites that take a parsed query to the normal form the builder maps onto plan nodes.

Each pass has a name and a line saying what it does; ``PIPELINE`` runs them in order. A check is a
pass that refuses the query or leaves it as it is. ``names()`` lists them, ``run`` can leave some
out (for tests: what a pass is for shows in what planning does without it) and records the query
after each (``duckflock explain --verbose``).

sqlglot's optimizer rules are passes of their own here, run as its ``optimize`` would run them
(the same keyword arguments, one schema for all of them). The ones kept keep DuckDB semantics;
its type annotation, canonicalization and simplification (also the one pushdown_predicates runs:
sql/pushdown.py) are left out because DuckDB, not sqlglot, decides types and constant folding.
Its subquery unnesting is left out too: it turns IN / ANY / correlated subqueries into joins that
lose their NULL and empty-set semantics. Ours rewrite only the shapes that are exact (EXISTS ->
semi/anti join, a NULL-strict correlated scalar in WHERE -> join on grouped keys); every other
subquery is evaluated by DuckDB itself (see plan/distribute.py). merge_subqueries and
eliminate_subqueries are left out as well: inlining a derived table or CTE changed answers (an
outer join's NULL-extended computed columns, volatile calls copied, GROUP BY of an inlined
constant), and hoisting a derived table to a CTE moved a correlated one out of the subquery it
reads from. Neither changes a TPC-H plan's joins, exchanges or stages.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import cast

from sqlglot import exp
from sqlglot.optimizer.eliminate_ctes import eliminate_ctes
from sqlglot.optimizer.normalize import normalize
from sqlglot.optimizer.optimizer import OptimizerFn
from sqlglot.optimizer.pushdown_projections import pushdown_projections
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.qualify_columns import quote_identifiers
from sqlglot.schema import Schema, ensure_schema

from duckflock.catalog import Catalog
from duckflock.errors import DuckflockError
from duckflock.sql.allowlist import check_struct_names, check_supported
from duckflock.sql.asof_forms import asof_semi_anti_as_plain, asof_using_as_inequality, mark_asof_using
from duckflock.sql.decorrelate import scalar_subqueries_to_joins
from duckflock.sql.derived_names import unique_derived_names
from duckflock.sql.distinct_on import distinct_on_as_qualify
from duckflock.sql.from_forms import rewrite_from_forms
from duckflock.sql.functions import Aggregates
from duckflock.sql.join_groups import flatten_join_groups, groups_as_derived_tables
from duckflock.sql.join_order import optimize_joins
from duckflock.sql.normal_forms import (
    aggregate_calls_marked,
    any_all_subqueries,
    named_windows_written_out,
    order_by_star_as_all,
)
from duckflock.sql.order_all import order_by_all_written_out
from duckflock.sql.positions import plain_positions
from duckflock.sql.pushdown import pushdown_predicates
from duckflock.sql.query_constants import fix_clock
from duckflock.sql.rewrite_hazards import rules_to_skip
from duckflock.sql.round_trip import check_round_trip
from duckflock.sql.schema_db import SchemaDB
from duckflock.sql.semijoin import exists_to_semi_join
from duckflock.sql.shadowing import order_by_input_columns, unshadow_nested_sources, unshadow_semi_join_sides
from duckflock.sql.using_joins import check_using_joins


@dataclass
class Context:
    """What passes read besides the tree: the query's text, the tables and DuckDB's answers."""

    text: str
    catalog: Catalog
    schema_db: SchemaDB
    aggregates: Aggregates = field(init=False)
    tables: dict[str, dict[str, str]] = field(init=False)  # table -> column -> DuckDB type
    skip: set[str] = field(default_factory=set)  # sqlglot rules the rewrite_hazards check left out

    def __post_init__(self) -> None:
        self.aggregates = Aggregates(self.schema_db.aggregate_names)
        self.tables = {n: dict(info.columns) for n, info in self.catalog.tables.items()}

    @cached_property
    def schema(self) -> Schema:
        """``tables`` as sqlglot's rules take it: one for all of them, made when the first needs it."""
        return ensure_schema(cast(dict, self.tables), dialect="duckdb")


@dataclass(frozen=True)
class Pass:
    name: str
    description: str
    apply: Callable[[exp.Expr, Context], exp.Expr]
    check: bool = False  # it refuses the query or leaves it as it is


@dataclass(frozen=True)
class Step:
    """What one pass did to the query, for EXPLAIN VERBOSE."""

    name: str
    sql: str | None  # the query after it; None where it changed nothing
    note: str = ""  # where it did not run through: switched off, left out, refused the query


def _check(name: str, description: str, fn: Callable[[exp.Expr, Context], object]) -> Pass:
    def apply(tree: exp.Expr, ctx: Context) -> exp.Expr:
        fn(tree, ctx)
        return tree

    return Pass(name, description, apply, check=True)


def _rule(rule: OptimizerFn, description: str, first: bool = False) -> Pass:
    """One of sqlglot's optimizer rules (or one of ours in its place), given the keyword arguments
    of its signature that ``sqlglot.optimizer.optimize`` would give it; the ``first`` of them gets
    a copy of the tree, as optimize gives its first rule."""
    params = inspect.getfullargspec(rule).args

    def apply(tree: exp.Expr, ctx: Context) -> exp.Expr:
        given = {
            "schema": ctx.schema,
            "dialect": "duckdb",
            "db": None,
            "catalog": None,
            "sql": None,
            # isolate_tables wraps each joined table in a derived table for merge_subqueries to
            # merge back; without that rule it would leave them there.
            "isolate_tables": False,
            "quote_identifiers": False,
            "table_types": ctx.tables,
        }
        return rule(tree.copy() if first else tree, **{k: v for k, v in given.items() if k in params})

    return Pass(getattr(rule, "__name__", ""), description, apply)


def _skip_hazardous_rules(tree: exp.Expr, ctx: Context) -> None:
    ctx.skip = rules_to_skip(tree, ctx.schema_db.volatile_names, ctx.schema_db.describe)


# Up to the checks of the tree as the user wrote it, rewritten to forms the rest reads. An error of
# sqlglot's in these is a bug (told as one); in NORMALIZE, a query its rewrites do not understand.
PREPARE: tuple[Pass, ...] = (
    _check(
        "round_trip",
        "sqlglot's reading of the query renders back to SQL DuckDB reads the same way",
        lambda t, c: check_round_trip(
            c.schema_db.con, c.schema_db.function_aliases, c.text, t, c.schema_db.type_aliases
        ),
    ),
    Pass(
        "fix_clock",
        "each call of the transaction's clock replaced by its value",
        lambda t, c: fix_clock(t, c.schema_db),
    ),
    Pass(
        "plain_positions",
        "column positions (ORDER BY 2, GROUP BY 1) as DuckDB reads them",
        lambda t, c: plain_positions(t),
    ),
    Pass(
        "distinct_on_as_qualify",
        "DISTINCT ON as a window the planner distributes",
        lambda t, c: distinct_on_as_qualify(t),
    ),
    Pass(
        "flatten_join_groups",
        "parenthesized joins as the flat join lists the builder reads",
        lambda t, c: flatten_join_groups(t, c.schema_db),
    ),
    Pass(
        "from_forms",
        "FROM items in forms the builder does not read, as ones it does",
        lambda t, c: rewrite_from_forms(t, c.schema_db),
    ),
    Pass(
        "mark_asof_using",
        "each ASOF join with USING marked by the column it compares with >=",
        lambda t, c: mark_asof_using(t),
    ),
    Pass(
        "asof_semi_anti_as_plain",
        "an ASOF SEMI / ANTI join as the plain one (same rows)",
        lambda t, c: asof_semi_anti_as_plain(t),
    ),
    _check("supported", "every construct is one the planner handles", lambda t, c: check_supported(t)),
    _check(
        "struct_names",
        "no STRUCT column named like a FROM item",
        lambda t, c: check_struct_names(t, c.catalog),
    ),
    Pass(
        "unique_derived_names",
        "derived tables' and CTEs' output names made unique as DuckDB does",
        lambda t, c: unique_derived_names(t, c.tables),
    ),
    _check(
        "using_joins",
        "JOIN ... USING read by sqlglot as DuckDB reads it",
        lambda t, c: check_using_joins(t, c.schema_db),
    ),
)

# The normal form: names unshadowed, then sqlglot's qualify and our rewrites after it, then the
# rules of sqlglot's optimizer kept (in its order) with ours in place of two of them.
NORMALIZE: tuple[Pass, ...] = (
    Pass(
        "aggregate_calls_marked",
        "DuckDB aggregates sqlglot does not know as aggregate nodes",
        lambda t, c: aggregate_calls_marked(t, c.aggregates),
    ),
    Pass(
        "named_windows_written_out",
        "OVER w ... WINDOW w AS (...) written out in each window",
        lambda t, c: named_windows_written_out(t),
    ),
    Pass("order_by_star_as_all", "ORDER BY * as ORDER BY ALL", lambda t, c: order_by_star_as_all(t)),
    Pass("any_all_subqueries", "the query under ANY / ALL as a subquery", lambda t, c: any_all_subqueries(t)),
    Pass(
        "unshadow_semi_join_sides",
        "each SEMI / ANTI join's right side under a fresh name",
        lambda t, c: unshadow_semi_join_sides(t),
    ),
    Pass(
        "unshadow_nested_sources",
        "every FROM item named like one before it renamed",
        lambda t, c: unshadow_nested_sources(t),
    ),
    _check(
        "rewrite_hazards",
        "volatile or order-dependent CTEs refused; rules that would change the answer left out",
        _skip_hazardous_rules,
    ),
    _rule(qualify, "sqlglot: every column qualified, stars expanded", first=True),
    _rule(asof_using_as_inequality, "an ASOF join's USING column compared with >="),
    _rule(groups_as_derived_tables, "join groups kept as derived tables"),
    _rule(order_by_all_written_out, "ORDER BY ALL as every output column"),
    _rule(order_by_input_columns, "ORDER BY names of input columns qualified, as DuckDB binds them"),
    _rule(exists_to_semi_join, "EXISTS / NOT EXISTS as semi / anti joins"),
    _rule(
        scalar_subqueries_to_joins,
        "a NULL-strict correlated scalar subquery in WHERE as a join on grouped keys",
    ),
    _rule(pushdown_projections, "sqlglot: unused columns of derived tables dropped"),
    _rule(normalize, "sqlglot: predicates in conjunctive normal form"),
    _rule(pushdown_predicates, "predicates moved into join conditions and derived tables"),
    _rule(optimize_joins, "joins ordered so each one's condition reads the tables before it"),
    _rule(eliminate_ctes, "sqlglot: unused CTEs removed"),
    _rule(quote_identifiers, "sqlglot: identifiers quoted"),
)

PIPELINE: tuple[Pass, ...] = PREPARE + NORMALIZE


def names() -> list[str]:
    """The passes' names, in the order they run."""
    return [p.name for p in PIPELINE]


def run(
    passes: Sequence[Pass],
    tree: exp.Expr,
    ctx: Context,
    disabled: Collection[str] = (),
    trace: list[Step] | None = None,
) -> exp.Expr:
    """``tree`` after ``passes`` in order, without those named in ``disabled``; with ``trace``,
    what each did is appended to it (also the one that refused the query, before its error goes on)."""
    unknown = sorted(set(disabled) - set(names()))
    if unknown:
        raise ValueError(f"no pass named {', '.join(unknown)}: the passes are {', '.join(names())}")
    for p in passes:
        note = (
            "switched off"
            if p.name in disabled
            else "left out (rewrite_hazards)"
            if p.name in ctx.skip
            else ""
        )
        if note:
            if trace is not None:
                trace.append(Step(p.name, None, note))
            continue
        before = _text(tree) if trace is not None else ""
        try:
            tree = p.apply(tree, ctx)
        except Exception as e:
            if trace is not None:
                refused = isinstance(e, DuckflockError)
                trace.append(
                    Step(p.name, None, "refused the query" if refused else f"failed ({type(e).__name__})")
                )
            raise
        if trace is not None:
            after = _text(tree)
            trace.append(Step(p.name, after if after != before else None))
    return tree


def _text(tree: exp.Expr) -> str:
    return tree.sql(dialect="duckdb", pretty=True)


def format_trace(trace: Sequence[Step]) -> str:
    """The query after each pass that changed it, in order; then the others, named by what they did."""
    checks = {p.name for p in PIPELINE if p.check}
    lines = ["Passes (the query after each one that changed it):"]
    others: dict[str, list[str]] = {}
    for step in trace:
        if step.sql is not None:
            lines.append(f"  {step.name}:")
            lines.extend(f"    {line}" for line in step.sql.splitlines())
        else:
            what = step.note or ("checks passed" if step.name in checks else "no change")
            others.setdefault(what, []).append(step.name)
    lines.extend(f"  {what}: {', '.join(which)}" for what, which in others.items())
    if not trace:  # DESCRIBE, SHOW TABLES, or SQL only DuckDB parses: answered as written
        lines = ["Passes: none ran (the query is answered as it is written)"]
    return "\n".join(lines)
