"""A caller's side of the Arrow Flight transport: control calls to one worker and fetching rows."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as flight

from duckflock.errors import TransportError
from duckflock.transport.flight import CallAuth, client_for, first_line


class WorkerUnresponsive(TransportError):
    """The worker did not answer in time, or could not be reached (frozen, gone, cut off)."""


class WorkerClient:
    """Worker ``rank`` of a session, at ``location``; errors are TransportErrors naming it."""

    def __init__(self, rank: int, location: str, token: str, tls_root: bytes | None):
        self.rank = rank
        self.location = location
        self._token = token
        self._auth = CallAuth(token).options
        self._client = client_for(location, tls_root)

    def call(self, kind: str, body: bytes = b"", timeout: float | None = None) -> bytes:
        """The worker's answer to a control call (empty when it sends none); WorkerUnresponsive
        when it has not answered within ``timeout`` seconds."""
        results = list(self.stream(kind, body, timeout))
        return results[0] if results else b""

    def stream(self, kind: str, body: bytes = b"", timeout: float | None = None) -> Iterator[bytes]:
        """The worker's answers to a control call, as they come (a query's progress, then its reply)."""
        options = self._auth if timeout is None else CallAuth(self._token, timeout).options
        try:
            for result in self._client.do_action(flight.Action(kind, body), options=options):
                yield result.body.to_pybytes()
        except flight.FlightUnauthenticatedError:
            raise TransportError(f"worker {self.rank} at {self.location} refused the token") from None
        except (flight.FlightTimedOutError, flight.FlightUnavailableError) as e:
            raise WorkerUnresponsive(f"worker {self.rank} at {self.location}: {first_line(e)}") from None
        except flight.FlightError as e:
            raise TransportError(f"worker {self.rank} at {self.location}: {first_line(e)}") from None

    def fetch(self, ticket: bytes) -> pa.Table:
        return self._client.do_get(flight.Ticket(ticket), options=self._auth).read_all()

    def stream_rows(self, ticket: bytes) -> Iterator[pa.RecordBatch]:
        """The rows of ``fetch``, batch by batch as they arrive."""
        for chunk in self._client.do_get(flight.Ticket(ticket), options=self._auth):
            yield chunk.data

    def close(self) -> None:
        self._client.close()
