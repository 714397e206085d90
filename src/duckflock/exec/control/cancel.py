"""One call's cancellation, a first-class message: whoever stops a query (``Session.interrupt``,
Ctrl-C, SIGTERM, a caller that went away) sets it from any thread; whoever runs the call registers
what stopping means there (fail the query on every rank, which interrupts their DuckDB; ask rank 0
of an MPI job or worker 0 to do so).

A token per call, not a flag on the session: a cancel that arrives as one query ends can never
stop the next one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from duckflock.errors import QueryCancelled

Hook = Callable[[str], None]


class Cancel:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hooks: list[Hook] = []
        self.reason: str | None = None

    def set(self, reason: str) -> None:
        """Stop the call (once; later reasons are ignored). Returns at once: the hooks only send."""
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
            hooks = list(self._hooks)
        for hook in hooks:
            hook(reason)

    @property
    def is_set(self) -> bool:
        return self.reason is not None

    def check(self) -> None:
        """Raise QueryCancelled if the call was cancelled."""
        if self.reason is not None:
            raise QueryCancelled(self.reason)

    @contextmanager
    def hooked(self, hook: Hook) -> Iterator[None]:
        """While the block runs, a cancel calls ``hook(reason)`` (at once, if it came already)."""
        with self._lock:
            reason = self.reason
            if reason is None:
                self._hooks.append(hook)
        if reason is not None:
            hook(reason)
        try:
            yield
        finally:
            with self._lock:
                if hook in self._hooks:
                    self._hooks.remove(hook)
