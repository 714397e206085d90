"""A session on running ``duckflock worker`` processes over Arrow Flight. The first worker plans each
query and returns its result; the workers exchange data among themselves, never through this
process. The worker's side is ``exec.worker``."""

from __future__ import annotations

import contextlib
import os
import pickle
import secrets
from dataclasses import replace

import pyarrow as pa

from duckflock.errors import DuckflockError, TransportError
from duckflock.exec.cancel import Cancel
from duckflock.exec.driver import QueryOutcome
from duckflock.exec.messages import (
    CloseRequest,
    ErrorReply,
    PlanReply,
    PlanRequest,
    Prepared,
    PrepareSession,
    ProgressReply,
    ResultTicket,
    SqlReply,
    SqlRequest,
    StartSession,
    from_json,
    to_json,
)
from duckflock.exec.progress import Follow, ProgressCallback
from duckflock.exec.result_files import ResultWriter, is_directory
from duckflock.local_duckdb import local_time_zone
from duckflock.plan.stages import StagePlan
from duckflock.transport.flight_client import WorkerClient
from duckflock.versions import SAME_EVERYWHERE, check_same


class FlightBackend:
    def __init__(self, workers: list[str], token: str, tls_root: bytes | None, config: dict[str, object]):
        scheme = "grpc+tls" if tls_root else "grpc+tcp"
        self.locations = [w if "://" in w else f"{scheme}://{w}" for w in workers]
        twice = sorted({w for w in self.locations if self.locations.count(w) > 1})
        if twice:  # one worker process serves one rank of a session
            raise DuckflockError(f"worker {', '.join(twice)} is listed more than once")
        self.ranks = len(self.locations)
        self.sid = secrets.token_hex(8)
        self._clients = [WorkerClient(r, loc, token, tls_root) for r, loc in enumerate(self.locations)]
        # Workers' hosts may be set to other time zones: all answer in the caller's.
        zone = config.get("time_zone") or os.environ.get("DUCKFLOCK_TIME_ZONE") or local_time_zone()
        # Workers on other hosts read their own copies unless told the storage is shared
        # (docs/workers.md), as the CLI without --shared-data: assuming it, a worker read
        # partitions it does not hold (IO Error: No files found).
        config = {"shared_storage": False, **config, "time_zone": zone}
        self.time_zone = str(zone)
        try:  # every worker knows the session before any connects to its peers
            prepared = []
            for client in self._clients:
                prepare = PrepareSession(self.sid, client.rank, self.locations, config)
                prepared.append(_prepared(client, client.call("prepare", to_json(prepare))))
            check_same([p.versions for p in prepared], "worker")
            shares = [p.share_bytes for p in prepared]
            # Every worker builds a copy of a broadcast side: the smallest host bounds them.
            for client in self._clients:
                client.call("start", to_json(StartSession(self.sid, min(shares))))
        except DuckflockError:  # a transport's, or workers of different versions
            self.close()
            raise

    def _ask(self, kind: str, request: SqlRequest | PlanRequest) -> SqlReply | PlanReply:
        reply = pickle.loads(self._clients[0].call(kind, to_json(request)))  # workers are trusted
        if isinstance(reply, ErrorReply):
            raise reply.error
        return reply

    def _ask_following(self, request: SqlRequest, progress: ProgressCallback) -> SqlReply | PlanReply:
        """Like ``_ask``, with the query's progress snapshots streamed ahead of its reply."""
        follow = Follow(progress)
        reply = None
        for payload in self._clients[0].stream("sql", to_json(request)):
            reply = pickle.loads(payload)  # workers are trusted
            if isinstance(reply, ProgressReply):
                follow(reply.progress)
        if reply is None or isinstance(reply, ProgressReply):
            raise TransportError(f"worker 0 at {self.locations[0]} ended the query's stream without a reply")
        if isinstance(reply, ErrorReply):
            raise reply.error
        follow.raise_error()
        return reply

    def run(
        self,
        query: str,
        profile: bool = False,
        progress: ProgressCallback | None = None,
        output: str | None = None,
        cancel: Cancel | None = None,
    ) -> QueryOutcome:
        """An ``output`` file is written here, from the result as it streams in."""
        if output is not None and is_directory(output):
            # Parts would land on the workers' hosts, outside the data directory they confine to.
            raise DuckflockError("with workers, --output takes a file, not a directory")
        request = SqlRequest(query, profile, session=self.sid)
        if progress is None:
            reply = self._ask("sql", request)
        else:
            reply = self._ask_following(replace(request, progress=True), progress)
        assert isinstance(reply, SqlReply)
        ticket = to_json(ResultTicket(self.sid, reply.rows))
        if output is None:
            reply.outcome.table = self._clients[0].fetch(ticket)
            return reply.outcome
        outcome = reply.outcome
        plan = outcome.plan
        writer = ResultWriter(output, plan.output_schema, plan.output_types, time_zone=self.time_zone)
        try:
            for batch in self._clients[0].stream_rows(ticket):
                writer.write(batch)
            writer.commit()
        except BaseException:
            writer.abort()
            raise
        outcome.table = pa.Table.from_batches([], outcome.plan.output_schema)
        outcome.rows_written = writer.rows
        return outcome

    def plan(self, query: str) -> StagePlan:
        reply = self._ask("plan", PlanRequest(query, session=self.sid))
        assert isinstance(reply, PlanReply)
        return reply.plan

    def close(self) -> None:
        for client in self._clients:
            with contextlib.suppress(TransportError):
                client.call("close", to_json(CloseRequest(self.sid)))
            client.close()


def _prepared(client: WorkerClient, reply: bytes) -> Prepared:
    try:
        return from_json(Prepared, reply)
    except (ValueError, TypeError):  # an older worker answers in its own words
        raise DuckflockError(
            f"worker {client.rank} at {client.location} answered prepare as another duckflock version "
            f"does; {SAME_EVERYWHERE}"
        ) from None
