"""Whether the CLI's stderr ends on a terminal, as the ranks it launches are told.

Under ``mpiexec`` rank 0's stderr is a pipe to the launcher even when the user's is a terminal, so
the launching process tells its ranks that their stderr ends on a terminal, and of what width.
"""

from __future__ import annotations

import os
import shutil
import sys

_TERMINAL_ENV = "DUCKFLOCK_CLI_TERMINAL_WIDTH"


def launch_env() -> dict[str, str]:
    """Environment for a relaunched job whose stderr is this process's terminal."""
    if not sys.stderr.isatty():
        return {}
    return {_TERMINAL_ENV: str(shutil.get_terminal_size().columns)}


def launcher_terminal_width() -> int | None:
    """The width of the launcher's terminal, when this process was launched by one on a terminal."""
    width = os.environ.get(_TERMINAL_ENV)
    return int(width) if width else None
