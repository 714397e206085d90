"""The one error line duckflock prints: rich only, so the launcher process need not load Arrow."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text


def print_error(console: Console, message: str) -> None:
    """One error line; the message is printed literally (DuckDB messages contain brackets)."""
    console.print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True)
