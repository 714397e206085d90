"""What a Session needs from the ranks behind it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from duckflock.exec.driver import QueryOutcome
    from duckflock.plan.stages import StagePlan


class Backend(Protocol):
    @property
    def ranks(self) -> int:
        """How many ranks answer each query."""
        ...

    def run(self, query: str, profile: bool = False) -> QueryOutcome:
        """Run ``query`` on every rank; raises a DuckflockError naming the cause when it fails."""
        ...

    def plan(self, query: str) -> StagePlan:
        """The distributed plan of ``query``, without running it."""
        ...

    def close(self) -> None:
        """Release the ranks (stop them when this backend started them)."""
        ...
