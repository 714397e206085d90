"""What a Session needs from the ranks behind it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

from duckflock.errors import TransportError

if TYPE_CHECKING:
    from duckflock.exec.control.cancel import Cancel
    from duckflock.exec.reports import ProgressCallback, QueryOutcome
    from duckflock.flightsql.parts import PartServing
    from duckflock.plan.stages import StagePlan

R = TypeVar("R")


def expect_reply(kind: type[R], reply: object, sender: str) -> R:
    """``reply`` as the ``kind`` a request asked for. Replies come from other processes: a mismatch
    (a reply meant for another request) is an error, checked even under ``python -O``."""
    if not isinstance(reply, kind):
        raise TransportError(f"{sender} answered with {type(reply).__name__} where {kind.__name__} was due")
    return reply


class Backend(Protocol):
    @property
    def ranks(self) -> int:
        """How many ranks answer each query."""
        ...

    def run(
        self,
        query: str,
        profile: bool = False,
        progress: ProgressCallback | None = None,
        output: str | None = None,
        cancel: Cancel | None = None,
        serve_parts: PartServing | None = None,
    ) -> QueryOutcome:
        """Run ``query`` on every rank; raises a DuckflockError naming the cause when it fails.
        ``cancel`` may be set from another thread while it runs: the query then stops on every
        rank within about a second, and this raises QueryCancelled (never waiting on a lost peer).
        ``progress`` is called with snapshots while it runs (possibly from another thread); an
        exception it raises fails the call once the query is over, not the session. With
        ``output`` the result is written there (a file, or part files in a directory) and the
        outcome's table is empty. With ``serve_parts`` an unordered result stays on the ranks, each
        serving its part (flightsql/parts.py; ``QueryOutcome.parts``)."""
        ...

    def plan(self, query: str) -> StagePlan:
        """The distributed plan of ``query``, without running it."""
        ...

    def close(self) -> None:
        """Release the ranks (stop them when this backend started them)."""
        ...
