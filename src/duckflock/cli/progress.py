"""The query's progress on stderr, while it runs: only on a terminal, and only for a query that takes
longer than a moment, so piped, captured and quick runs print exactly what they did before.

Under ``mpiexec`` the launching process tells its ranks whether their stderr ends on a terminal
(cli/terminal.py).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner

from duckflock.cli.terminal import launcher_terminal_width

if TYPE_CHECKING:
    from duckflock.exec.reports import Progress

SHOW_AFTER_S = 0.5


def terminal_console() -> Console | None:
    """A console on stderr when it ends on a terminal, else None."""
    width = launcher_terminal_width()
    if width:
        return Console(stderr=True, force_terminal=True, width=width)
    console = Console(stderr=True)
    return console if console.is_terminal else None


def describe(p: Progress | None, seconds: float) -> str:
    from duckflock.units import human

    if p is None:
        return f"planning · {seconds:.1f} s"
    return (
        f"stages {p.done}/{p.stages} done, {p.running} running · {p.rows:,} rows, "
        f"{human(p.bytes, 'B')} moved · {seconds:.1f} s"
    )


class ProgressDisplay:
    """A progress callback that shows the latest snapshot as one live line, from ``SHOW_AFTER_S``
    into the query until the ``with`` block ends (then the line goes away)."""

    def __init__(self, console: Console):
        self._console = console
        self._lock = threading.Lock()
        self._latest: Progress | None = None
        self._live: Live | None = None
        self._ended = False
        self._t0 = time.perf_counter()
        self._spinner = Spinner("dots", style="cyan")
        self._timer = threading.Timer(SHOW_AFTER_S, self._show)
        self._timer.daemon = True

    def __call__(self, p: Progress) -> None:
        self._latest = p  # the live line reads it at its next refresh

    def _line(self) -> Spinner:
        self._spinner.update(text=describe(self._latest, time.perf_counter() - self._t0))
        return self._spinner

    def _show(self) -> None:
        with self._lock:
            if not self._ended:
                self._live = Live(
                    console=self._console, get_renderable=self._line, transient=True, refresh_per_second=8
                )
                self._live.start()

    def __enter__(self) -> ProgressDisplay:
        self._t0 = time.perf_counter()
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()
        with self._lock:
            self._ended = True
            if self._live is not None:
                self._live.stop()
