"""Session-wide test data: a tiny TPC-H and a set of edge-case tables, built once."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests: a quick default for `make test`, the same examples on every run (a red CI run
# replays); DUCKFLOCK_HYPOTHESIS=thorough for a long, random search.
# No deadline: a test's wall time on a shared, noisy machine is not what it checks.
settings.register_profile("default", max_examples=40, deadline=None, derandomize=True)
settings.register_profile("thorough", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("DUCKFLOCK_HYPOTHESIS", "default"))


@pytest.fixture(autouse=True)
def ctrl_c_as_at_a_terminal():
    """Ctrl-C raises KeyboardInterrupt here and in the processes tests start, as under a terminal,
    even where the suite was started in the background of a shell (which ignores SIGINT for it,
    and an ignored signal stays ignored in every process started from it)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def tpch_dir(tmp_path_factory) -> Path:
    from duckflock.ingest.tpch import generate_tpch

    out = tmp_path_factory.mktemp("tpch")
    generate_tpch(0.01, out, parts=4, progress=False)
    return out
