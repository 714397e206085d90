"""Every message of the control paths, as a frozen dataclass with named fields.

Two conversations carry them:
  - driver <-> ranks, pickled on the multiplexer (``exchange.mux``): ``RunQuery``, ``DropParts`` and
    ``Stop`` on the CONTROL channel, ``RankStats`` back to the driver on the query's COLLECTIVE channel;
  - caller <-> a session's first rank, through a session backend (``backends/``): the requests
    ``SqlRequest``, ``PlanRequest``, ``CancelRequest``, ``CloseRequest`` (over Flight also
    ``Heartbeat``) and the replies
    ``Ready``, ``SqlReply``, ``PlanReply``, ``ErrorReply``; a ``SqlRequest`` asking for progress
    gets ``ProgressReply`` snapshots ahead of its reply (a stream of results over Flight). The MPI
    job's socket pickles both ways; a Flight worker takes requests as JSON (``to_json``/
    ``from_json``: it never unpickles what a caller sends) and pickles its replies, which the
    caller trusts. Over Flight the requests name their session and ``PrepareSession``/
    ``StartSession``/``ResultTicket`` set the session up and fetch rows (a worker answers
    ``PrepareSession`` with ``Prepared``); ``WorkerStatus`` tells whether a session holds a worker.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from duckflock.errors import DuckflockError
    from duckflock.exec.reports import Progress, QueryOutcome, StageStats
    from duckflock.flightsql.parts import PartInfo, PartServing
    from duckflock.plan.stages import StagePlan


# ---- driver <-> ranks (the multiplexer) -------------------------------------------------------
@dataclass(frozen=True)
class RunQuery:
    """Driver -> every rank: the plan and the catalog entries it reads."""

    qid: int
    plan: StagePlan
    tables: dict
    profile: bool
    # Every rank writes its share of the result to part files here (exec/results/result_files.py).
    parts_dir: str | None = None
    # Every rank serves its share of the result itself (flightsql/parts.py).
    serve_parts: PartServing | None = None


@dataclass(frozen=True)
class DropParts:
    """Driver -> every rank, after a query serving its result in parts failed: delete the parts
    of it that ranks hold already (``PartServing.handle``)."""

    handle: str


@dataclass(frozen=True)
class Stop:
    """Driver -> every rank: the session ends; leave the serving loop."""


@dataclass(frozen=True)
class RankStats:
    """Rank -> driver, when a query is profiled or writes parts: what each of its stages did."""

    rank: int
    stats: list[StageStats]
    part: PartInfo | None = None  # the rank's part of the result it serves (RunQuery.serve_parts)


# ---- caller <-> a session's first rank (session backends) -------------------------------------
@dataclass(frozen=True)
class SqlRequest:
    query: str
    profile: bool = False
    session: str = ""  # the Flight session it belongs to (an MPI job serves one caller only)
    progress: bool = False  # send ProgressReply snapshots while the query runs, before the reply
    output: str | None = None  # write the result there (a file, or a directory of parts), not return it
    serve_parts: PartServing | None = None  # each rank serves its part of an unordered result


@dataclass(frozen=True)
class PlanRequest:
    query: str
    session: str = ""


@dataclass(frozen=True)
class CloseRequest:
    session: str = ""


@dataclass(frozen=True)
class CancelRequest:
    """Caller -> a session's first rank, while a ``SqlRequest`` runs: stop it on every rank; its
    reply is then an ``ErrorReply`` of QueryCancelled (none, when the query had ended already)."""

    session: str = ""
    reason: str = "the query was cancelled"


@dataclass(frozen=True)
class Heartbeat:
    """Caller -> a Flight session's first worker, every second while a call runs: the caller is
    still there (a worker cancels the query of a caller silent past its idle timeout); that the
    worker answers tells the caller it is not frozen."""

    session: str


@dataclass(frozen=True)
class PrepareSession:
    """Caller -> every Flight worker, first: take part in this session as ``rank`` of ``peers``."""

    session: str
    rank: int
    peers: list[str]
    config: dict[str, Any] = field(default_factory=dict)  # Config field overrides


@dataclass(frozen=True)
class Prepared:
    """A Flight worker's answer to ``PrepareSession``: the memory one rank may hold on its host,
    and its versions (``versions.engine_versions``), which all workers must share."""

    share_bytes: int
    versions: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StartSession:
    """Caller -> every Flight worker, once all are prepared: connect to the peers and serve.
    ``smallest_share_bytes`` is the smallest ``Prepared.share_bytes`` of any worker (0: the
    worker's own): the planner bounds broadcasts by it, as every rank builds a copy."""

    session: str
    smallest_share_bytes: int = 0


@dataclass(frozen=True)
class ResultTicket:
    """Caller -> worker 0 (a Flight ticket): the rows of an answered ``SqlRequest``."""

    session: str
    key: str


@dataclass(frozen=True)
class WorkerStatus:
    """A Flight worker's answer to ``status``: the session holding it (and its memory), if any."""

    session: str | None


@dataclass(frozen=True)
class Ready:
    """MPI job -> caller, once: the ranks are up."""

    ranks: int


@dataclass(frozen=True)
class SqlReply:
    """The query's outcome without its rows; ``rows`` says where to fetch them: an Arrow IPC file
    in shared memory (MPI job) or a ``ResultTicket`` key (Flight)."""

    outcome: QueryOutcome
    rows: str


@dataclass(frozen=True)
class ProgressReply:
    """Rank 0 -> caller while a ``SqlRequest`` with ``progress`` runs: one snapshot. The request's
    own reply (``SqlReply`` or ``ErrorReply``) follows the last of them."""

    progress: Progress


@dataclass(frozen=True)
class PlanReply:
    plan: StagePlan


@dataclass(frozen=True)
class ErrorReply:
    """The request failed; the caller raises ``error``."""

    error: DuckflockError


M = TypeVar("M")


def to_json(message: DataclassInstance) -> bytes:
    return json.dumps(asdict(message)).encode()


def from_json(kind: type[M], body: bytes) -> M:
    return kind(**json.loads(body))
