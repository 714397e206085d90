"""This process is rank 0 of ranks started by someone else (``spmd``): queries go to its Driver."""

from __future__ import annotations

from typing import TYPE_CHECKING

from duckflock.exec.control.cancel import Cancel
from duckflock.exec.control.driver import Driver
from duckflock.exec.reports import ProgressCallback, QueryOutcome
from duckflock.plan.stages import StagePlan

if TYPE_CHECKING:
    from duckflock.flightsql.parts import PartServing


class DriverBackend:
    def __init__(self, driver: Driver):
        self.driver = driver

    @property
    def ranks(self) -> int:
        return self.driver.ranks

    def run(
        self,
        query: str,
        profile: bool = False,
        progress: ProgressCallback | None = None,
        output: str | None = None,
        cancel: Cancel | None = None,
        serve_parts: PartServing | None = None,
    ) -> QueryOutcome:
        return self.driver.run(
            query, profile=profile, progress=progress, output=output, cancel=cancel, serve_parts=serve_parts
        )

    def plan(self, query: str) -> StagePlan:
        return self.driver.plan(query)

    def close(self) -> None:
        """Nothing: whoever started the ranks stops them (``spmd`` when rank 0 leaves its block)."""
