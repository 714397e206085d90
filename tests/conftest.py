"""Session-wide test data: a tiny TPC-H and a set of edge-case tables, built once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests: a quick default for `make test`; DUCKFLOCK_HYPOTHESIS=thorough for a long search.
# No deadline: a test's wall time on a shared, noisy machine is not what it checks.
settings.register_profile("default", max_examples=40, deadline=None)
settings.register_profile("thorough", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("DUCKFLOCK_HYPOTHESIS", "default"))


@pytest.fixture(scope="session")
def tpch_dir(tmp_path_factory) -> Path:
    from duckflock.ingest.tpch import generate_tpch

    out = tmp_path_factory.mktemp("tpch")
    generate_tpch(0.01, out, parts=4, progress=False)
    return out
