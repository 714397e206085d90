"""The planner's entry point: SQL text to the stages every rank runs.

bind (sql/: parse, check, qualify, decorrelate, map clauses onto plan nodes) → distribute (plan/:
partitioning rules insert exchanges and choose join strategies) → cut (plan/stages: one stage per
exchange boundary).
"""

from __future__ import annotations

from dataclasses import replace

from duckflock.catalog import Catalog
from duckflock.config import Config
from duckflock.plan.distribute import distribute
from duckflock.plan.stages import StagePlan, cut
from duckflock.sql.bind import bind
from duckflock.sql.schema_db import SchemaDB


def plan_query(
    sql: str, catalog: Catalog, schema_db: SchemaDB, size: int, config: Config, per_process: int = 1
) -> StagePlan:
    """The stage plan of ``sql`` over ``size`` ranks, ``per_process`` of them in each process, or
    SqlError/CatalogError naming what is wrong."""
    bound = bind(sql, catalog, schema_db, config.driver_fallback_bytes)
    physical, fused = distribute(bound.plan, catalog, size, config, per_process)
    plan = cut(physical, bound.output_names, bound.arrow_schema)
    if fused and not all(
        s.runs_once_per_process(catalog, config.fuse_min_bytes)
        for s in plan.stages
        if s.whole_table_bytes(catalog) > config.broadcast_max_bytes
    ):
        # A table read whole, allowed one copy per process, would have one per rank after all.
        physical, _ = distribute(bound.plan, catalog, size, config, 1)
        plan = cut(physical, bound.output_names, bound.arrow_schema)
    return replace(plan, output_types=bound.output_types)
