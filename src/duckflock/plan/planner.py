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


def plan_query(sql: str, catalog: Catalog, schema_db: SchemaDB, size: int, config: Config) -> StagePlan:
    """The stage plan of ``sql`` over ``size`` ranks, or SqlError/CatalogError naming what is wrong."""
    bound = bind(sql, catalog, schema_db, config.driver_fallback_bytes)
    physical = distribute(bound.plan, catalog, size, config)
    return replace(cut(physical, bound.output_names, bound.arrow_schema), output_types=bound.output_types)
