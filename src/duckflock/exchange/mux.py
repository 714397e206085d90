"""The communication multiplexer: one thread per rank owns its transport (HyPer's design).

Compute threads hand it outgoing buffers and wait on inboxes; it issues non-blocking sends, drains
incoming messages and routes them by (query, channel). Waiting is polite — condition variables, and
an idle multiplexer sleeps until a send or (where the transport can tell) an arrival wakes it, or
polls with sleeps that grow while it stays idle (MPI) — so idle or oversubscribed ranks do not burn
a core busy-polling.

Tags carry the query number, so messages of a failed query are told apart from the next query's and
dropped; an ERROR message from any rank fails that query on every rank at its next wait.
"""

from __future__ import annotations

import collections
import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

from duckflock.errors import ExecutionError, TransportError
from duckflock.exchange import pickling
from duckflock.transport.base import TAG_BITS, SendHandle, Transport, view

CONTROL = 0  # driver -> workers: plans and commands (not tied to a query)
ERROR = 1  # any rank -> all: the query failed
COLLECTIVE = 2  # small pickled objects for allgather / bcast / gather
PROGRESS = 3  # any rank -> driver: a stage finished on that rank (its StageStats)
FIRST_EXCHANGE = 8  # exchanges use the channels from here on (exchange/shuffle.py)

# An idle multiplexer whose transport reports arrivals still looks at it this often: for a lost peer.
_IDLE_WAIT_S = 0.05


def _poll_sleep(quiet: float) -> float:
    """How long a multiplexer that must poll for arrivals (MPI) sleeps after ``quiet`` seconds
    without traffic. Each wake-up costs CPU that the rank's DuckDB could use, so the sleeps
    grow with the quiet time: an arrival waits at most a quarter of the quiet before it, and 1 ms
    while the rank is busy with queries; after a second of quiet, 5 ms (200 wake-ups a second)."""
    return 0.005 if quiet > 1.0 else min(0.001, max(0.00002, quiet / 4))


QID_BITS = 13
_CHANNEL_BITS = TAG_BITS - QID_BITS

T = TypeVar("T")  # what every rank contributes to a collective: the same type on each


def make_tag(qid: int, channel: int) -> int:
    if channel >> _CHANNEL_BITS:  # it would spill into the query's bits: messages of another query
        raise TransportError(f"channel {channel} out of range: too many exchanges in one query")
    return ((qid % (1 << QID_BITS)) << _CHANNEL_BITS) | channel


def split_tag(tag: int) -> tuple[int, int]:
    return tag >> _CHANNEL_BITS, tag & ((1 << _CHANNEL_BITS) - 1)


@dataclass
class Failure:
    rank: int
    stage: int | None
    cause: str

    def error(self) -> ExecutionError:
        return ExecutionError(self.rank, self.stage, self.cause)


class Mux:
    def __init__(
        self,
        transport: Transport,
        max_inflight_bytes: int = 64 << 20,
        busy_poll_s: float = 0.00005,
    ):
        self.transport = transport
        self.rank = transport.rank
        self.size = transport.size
        self.max_inflight = max_inflight_bytes
        self._cv = threading.Condition()
        self._outbox: collections.deque[tuple[int, int, object, int]] = collections.deque()
        self._inflight: list[tuple[SendHandle, int]] = []
        self._queued_bytes = 0
        self._inbox: dict[tuple[int, int], collections.deque[tuple[int, object]]] = {}
        self._failures: dict[int, Failure] = {}
        self._early: dict[tuple[int, int], collections.deque[object]] = {}
        self._finished: set[int] = set()
        self._stop = False
        self._fatal: str | None = None
        self.on_failure: Callable[[int], None] | None = None  # e.g. interrupt the running DuckDB query
        self.busy_poll_s = busy_poll_s
        # Set by a queued send and, where the transport can tell, by an arriving message: the
        # idle multiplexer sleeps on it rather than spinning.
        self._wake = threading.Event()
        self._told_of_arrivals = transport.set_waker(self._wake.set)
        self._thread = threading.Thread(target=self._run, name="duckflock-mux", daemon=True)
        self._thread.start()

    # ---- sending -------------------------------------------------------------------------------
    def send(
        self,
        dest: int,
        qid: int,
        channel: int,
        payload: object,
        nbytes: int | None = None,
        check: bool = True,
    ) -> None:
        """Queue a message; blocks while too many bytes are in flight (back-pressure).

        With ``check`` a failure of the query raises instead (there is no point sending more)."""
        tag = make_tag(qid, channel)
        if dest == self.rank:
            self._deliver(self.rank, tag, payload)
            return
        n = nbytes if nbytes is not None else view(payload).nbytes
        with self._cv:
            while check and self._queued_bytes > self.max_inflight and not self._stop:
                self._check(qid)
                self._cv.wait(0.05)
            if check:
                self._check(qid)
            self._outbox.append((dest, tag, payload, n))
            self._queued_bytes += n
        self._wake.set()

    def send_obj(self, dest: int, qid: int, channel: int, obj: object) -> None:
        self.send(dest, qid, channel, pickling.dumps(obj))

    def flush(self, qid: int) -> None:
        """Wait until every queued send has completed."""
        with self._cv:
            while (self._outbox or self._inflight) and not self._stop:
                self._check(qid)
                self._cv.wait(0.05)

    # ---- receiving -----------------------------------------------------------------------------
    def recv(self, qid: int, channel: int, timeout: float | None = None) -> tuple[int, object]:
        """Next message on (qid, channel) as (source, payload); raises if the query failed."""
        got = self.try_recv(qid, channel, timeout)
        if got is None:
            raise TransportError(f"rank {self.rank}: no message within {timeout:.0f} s")
        return got

    def try_recv(self, qid: int, channel: int, timeout: float | None) -> tuple[int, object] | None:
        """Like ``recv``, but None when nothing arrived within ``timeout`` seconds."""
        key = (qid % (1 << QID_BITS), channel)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while True:
                box = self._inbox.get(key)
                if box:
                    return box.popleft()
                self._check(qid, allow_control=channel == CONTROL)
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                self._cv.wait(0.05 if deadline is None else min(0.05, max(0.0, deadline - time.monotonic())))

    def recv_any(self, qid: int, channels: tuple[int, ...]) -> tuple[int, int, object]:
        """Next message on any of (qid, channel) as (channel, source, payload), first channels first."""
        q = qid % (1 << QID_BITS)
        with self._cv:
            while True:
                for channel in channels:
                    box = self._inbox.get((q, channel))
                    if box:
                        src, payload = box.popleft()
                        return channel, src, payload
                self._check(qid)
                self._cv.wait(0.05)

    def recv_obj(self, qid: int, channel: int, timeout: float | None = None) -> tuple[int, object]:
        src, payload = self.recv(qid, channel, timeout)
        return src, pickle.loads(view(payload))

    # ---- collectives over point-to-point (polite, work on every transport) ---------------------
    def allgather(self, qid: int, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order. A fast rank may already have sent its value for the
        next collective; such early values are kept for that call instead of being taken as this one's."""
        for dest in range(self.size):
            self.send_obj(dest, qid, COLLECTIVE, obj)
        out: dict[int, T] = {}
        for src in range(self.size):
            early = self._early.get((qid, src))
            if early:
                out[src] = cast(T, early.popleft())
        while len(out) < self.size:
            src, value = self.recv_obj(qid, COLLECTIVE)
            if src in out:
                self._early.setdefault((qid, src), collections.deque()).append(value)
            else:
                out[src] = cast(T, value)
        return [out[r] for r in range(self.size)]

    # ---- failures and query lifecycle ------------------------------------------------------------
    def fail(self, qid: int, stage: int | None, cause: str) -> None:
        """Report a failure of this rank to every rank (including itself)."""
        failure = Failure(self.rank, stage, cause)
        payload = pickle.dumps(failure)
        for dest in range(self.size):
            self.send(dest, qid, ERROR, payload, check=False)

    def failure(self, qid: int) -> Failure | None:
        with self._cv:
            return self._failures.get(qid % (1 << QID_BITS))

    def told_error(self, qid: int) -> ExecutionError | None:
        """The error of the first failure of query ``qid`` told to this rank (by any rank, this one
        included), or None."""
        failure = self.failure(qid)
        return failure.error() if failure is not None else None

    def report_failure(self, qid: int, stage: int | None, cause: str) -> ExecutionError:
        """The error a failure on this rank ends query ``qid`` with: the failure told to this rank
        already (another rank's notice interrupted its work, so what failed here is the echo);
        else this rank's ``cause``, told now to every rank."""
        told = self.told_error(qid)
        if told is not None:
            return told
        self.fail(qid, stage, cause)
        return ExecutionError(self.rank, stage, cause)

    def finish(self, qid: int) -> None:
        """Forget a finished query: drop its buffered messages and ignore late ones."""
        q = qid % (1 << QID_BITS)
        with self._cv:
            self._finished.add(q)
            self._finished.discard((q + (1 << (QID_BITS - 1))) % (1 << QID_BITS))  # window of reuse
            for key in [k for k in self._inbox if k[0] == q]:
                del self._inbox[key]
            for key in [k for k in self._early if k[0] % (1 << QID_BITS) == q]:
                del self._early[key]

    def _check(self, qid: int, allow_control: bool = False) -> None:
        if self._fatal is not None:
            raise TransportError(self._fatal)
        if not allow_control:
            f = self._failures.get(qid % (1 << QID_BITS))
            if f is not None:
                raise f.error()

    # ---- the multiplexer thread ------------------------------------------------------------------
    def _deliver(self, src: int, tag: int, payload: object) -> None:
        q, channel = split_tag(tag)
        with self._cv:
            if channel == ERROR:
                if q not in self._failures:
                    self._failures[q] = pickle.loads(view(payload))
                    # Not for a query this rank has finished: a rank's own notice (it sends it to
                    # itself too) or another rank's can arrive after it, while the next query runs.
                    if self.on_failure is not None and q not in self._finished:
                        self.on_failure(q)
            elif q not in self._finished or channel == CONTROL:
                self._inbox.setdefault((q, channel), collections.deque()).append((src, payload))
            self._cv.notify_all()

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as e:  # the mux thread must never die silently
            with self._cv:
                self._fatal = f"communication failed: {e}"
                self._cv.notify_all()

    def _loop(self) -> None:
        transport = self.transport
        idle_since = time.monotonic()
        while not self._stop:
            self._wake.clear()  # before looking: a send or arrival from now on wakes the next wait
            active = self._step(transport)
            if active:
                idle_since = time.monotonic()
            elif self._inflight or transport.busy():
                # Transfers in progress advance only while we poll: poll often, but sleep
                # between polls so DuckDB keeps the core (a spinning poller competes with it).
                time.sleep(self.busy_poll_s)
            elif self._told_of_arrivals:
                self._wake.wait(_IDLE_WAIT_S)
            else:
                self._wake.wait(_poll_sleep(time.monotonic() - idle_since))

    def _step(self, transport: Transport) -> bool:
        """One round: start queued sends, retire finished ones, deliver arrivals. Whether anything
        happened."""
        active = False
        with self._cv:
            while self._outbox:
                dest, tag, payload, n = self._outbox.popleft()
                self._inflight.append((transport.isend(dest, tag, payload), n))
                active = True
        if self._inflight:
            still = [(h, n) for h, n in self._inflight if not h.done()]
            if len(still) != len(self._inflight):
                with self._cv:
                    self._queued_bytes -= sum(n for _, n in self._inflight) - sum(n for _, n in still)
                    self._inflight = still
                    self._cv.notify_all()
                active = True
        for src, tag, payload in transport.poll():
            self._deliver(src, tag, payload)
            active = True
        lost = transport.peer_failure()
        if lost:
            raise TransportError(lost)
        return active

    def close(self, drain_s: float = 10.0) -> None:
        """Stop, after sending what is still queued (bounded: a dead peer must not block exit)."""
        deadline = time.monotonic() + drain_s
        with self._cv:
            while (self._outbox or self._inflight) and self._fatal is None and time.monotonic() < deadline:
                self._cv.wait(0.01)
            self._stop = True
            self._cv.notify_all()
        self._wake.set()
        self._thread.join(timeout=5)
