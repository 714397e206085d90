"""The one error line duckflock prints. rich is imported when it prints: the launcher process, and
every rank but rank 0, print nothing in a run that goes well, and are spared rich's memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


def print_error(message: str, console: Console | None = None) -> None:
    """One error line on ``console`` (stderr by default); the message is printed literally (DuckDB
    messages contain brackets)."""
    _print_line("error:", "bold red", message, console)


def print_warning(message: str, console: Console | None = None) -> None:
    """One warning line, as ``print_error`` prints an error: the command goes on."""
    _print_line("warning:", "bold yellow", message, console)


def _print_line(label: str, style: str, message: str, console: Console | None) -> None:
    from rich.console import Console
    from rich.text import Text

    console = console or Console(stderr=True, soft_wrap=True)
    console.print(Text.assemble((label, style), " ", message), soft_wrap=True)
