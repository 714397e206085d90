"""Fixtures of the distributed tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import make_table


@pytest.fixture(scope="session")
def bad_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad")
    # Rows are dealt round-robin over 4 partitions: i % 4 == 3 lands in partition 3, which lives on
    # rank 3 % ranks. Only those rows hold a string that is not a number.
    make_table(
        root,
        "bad",
        "SELECT i AS k, CASE WHEN i = 1003 THEN 'oops' ELSE CAST(i AS VARCHAR) END AS s FROM range(2000) t(i)",
        4,
    )
    make_table(root, "good", "SELECT i AS k, i * 2 AS v FROM range(2000) t(i)", 4, "hash", ("k",))
    make_table(root, "gone", "SELECT i AS k FROM range(100) t(i)", 2)
    (root / "gone" / "gone.1.parquet").write_bytes(b"this is not parquet")
    return root
