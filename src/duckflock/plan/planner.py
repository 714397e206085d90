"""The planner's entry point: SQL text to the stages every rank runs.

bind (sql/: parse, check, qualify, decorrelate, map clauses onto plan nodes) → distribute (plan/:
partitioning rules insert exchanges and choose join strategies) → cut (plan/stages: one stage per
exchange boundary).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path

from duckflock.catalog import Catalog
from duckflock.config import Config
from duckflock.errors import DuckflockError, InternalError
from duckflock.plan import exchange_columns
from duckflock.plan.distribute import distribute
from duckflock.plan.nodes import ExchangeRead
from duckflock.plan.stages import StagePlan, cut
from duckflock.sql.bind import bind
from duckflock.sql.passes import Step
from duckflock.sql.schema_db import SchemaDB


def plan_query(
    sql: str,
    catalog: Catalog,
    schema_db: SchemaDB,
    size: int,
    config: Config,
    per_process: int = 1,
    cores: int | None = None,
    *,
    disabled_passes: Collection[str] = (),
    trace: list[Step] | None = None,
) -> StagePlan:
    """The stage plan of ``sql`` over ``size`` ranks, ``per_process`` of them in each process of
    ``cores`` cores (None: as many as this one), or SqlError/CatalogError naming what is wrong.
    ``disabled_passes``: rewrites of sql/passes.py to leave out (tests); ``trace`` gets the query
    after each pass (EXPLAIN VERBOSE)."""
    try:
        return _plan(sql, catalog, schema_db, size, config, per_process, cores, disabled_passes, trace)
    except DuckflockError:
        raise
    except Exception as e:  # not a refusal: a bug, told as one, never answered another way
        raise InternalError("planner", _cause(e), sql.strip()) from e


def _cause(e: Exception) -> str:
    """The exception and where it was raised: the innermost frame, and duckflock's own innermost
    frame when that is in a library."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if f"{os.sep}duckflock{os.sep}" in f.filename]
    where = ours[-1:] + frames[-1:]
    at = " <- ".join(
        dict.fromkeys(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(where))
    )
    return f"{type(e).__name__}: {e}" + (f" (at {at})" if at else "")


def _plan(
    sql: str,
    catalog: Catalog,
    schema_db: SchemaDB,
    size: int,
    config: Config,
    per_process: int,
    cores: int | None,
    disabled_passes: Collection[str],
    trace: list[Step] | None,
) -> StagePlan:
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    bound = bind(
        sql, catalog, schema_db, config.driver_fallback_bytes, disabled_passes=disabled_passes, trace=trace
    )
    physical, copies_per_process = distribute(bound.plan, catalog, size, config, per_process)
    physical = exchange_columns.prune(physical)
    plan = _once_per_process(
        cut(physical, bound.output_names, bound.arrow_schema), catalog, config, per_process, cores
    )
    if copies_per_process and any(
        not s.once_per_process and s.whole_table_bytes(catalog) > config.broadcast_max_bytes
        for s in plan.stages
    ):
        # A table read whole, allowed one copy per process, would have one per rank after all.
        physical = exchange_columns.prune(distribute(bound.plan, catalog, size, config, 1)[0])
        plan = _once_per_process(
            cut(physical, bound.output_names, bound.arrow_schema), catalog, config, per_process, cores
        )
    return replace(plan, output_types=bound.output_types, query=sql.strip())


def _once_per_process(
    plan: StagePlan, catalog: Catalog, config: Config, per_process: int, cores: int
) -> StagePlan:
    """``plan`` with the stages that run once for all the ranks of a process marked
    (exec/resources/fused.py)."""
    if per_process == 1:
        return plan
    once, scans = config.fuse_min_bytes, per_process > cores
    final = plan.stages[-1].root
    returned = final.xid if isinstance(final, ExchangeRead) else None  # a gather's rows, as they are
    stages = tuple(
        replace(s, once_per_process=s.runs_once_per_process(catalog, once, per_process, scans, returned))
        for s in plan.stages
    )
    return replace(plan, stages=stages)
