"""Session-wide test data: a tiny TPC-H and a set of edge-case tables, built once."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import make_table


@pytest.fixture(scope="session")
def tpch_dir(tmp_path_factory) -> Path:
    from duckflock.ingest.tpch import generate_tpch

    out = tmp_path_factory.mktemp("tpch")
    generate_tpch(0.01, out, parts=4, progress=False)
    return out


@pytest.fixture(scope="session")
def edge_dir(tmp_path_factory) -> Path:
    """Tables that force the corner cases: mixed key types, NULLs, empty and one-row tables, skew,
    string and multi-column keys, more partitions than rows. Values come from expressions over
    range(); the expected answers come from single-process DuckDB, never from the test."""
    root = tmp_path_factory.mktemp("edge")
    make_table(root, "t_int", "SELECT (i % 300)::INTEGER AS k, i::INTEGER AS v FROM range(2000) t(i)",
               5, "hash", ("k",))
    make_table(root, "t_big", "SELECT i::BIGINT AS k, 'w' || (i % 7) AS w FROM range(0, 400) t(i)",
               3, "hash", ("k",))
    make_table(root, "t_big4", "SELECT i::BIGINT AS k, i * 1.5 AS d FROM range(0, 400) t(i)",
               5, "hash", ("k",))
    make_table(root, "na", "SELECT CASE WHEN i % 4 = 0 THEN NULL ELSE i % 50 END::INTEGER AS k, i AS x "
               "FROM range(500) t(i)", 4)
    make_table(root, "nb", "SELECT CASE WHEN i % 3 = 0 THEN NULL ELSE i % 40 END::BIGINT AS k, i * 10 AS y "
               "FROM range(300) t(i)", 3)
    make_table(root, "empty_t", "SELECT i::BIGINT AS k, 'z' AS z FROM range(0) t(i)", 1)
    make_table(root, "one_row", "SELECT 42::BIGINT AS k, 'only' AS label", 4, "hash", ("k",))
    make_table(root, "skew", "SELECT 1::INTEGER AS k, i AS v FROM range(1500) t(i)", 4)
    make_table(root, "skew2", "SELECT (i % 2)::INTEGER AS k, i AS u FROM range(60) t(i)", 3)
    make_table(root, "sa", "SELECT 'name-' || (i % 97) AS name, i AS v FROM range(800) t(i)", 4)
    make_table(root, "sb", "SELECT 'name-' || i AS name, i * 3 AS w FROM range(120) t(i)", 2, "range", ("name",))
    make_table(root, "m1", "SELECT (i % 20)::INTEGER AS a, 'b' || (i % 3) AS b, i AS v FROM range(600) t(i)", 4)
    make_table(root, "m2", "SELECT (i % 25)::BIGINT AS a, 'b' || (i % 4) AS b, i AS w FROM range(200) t(i)",
               3, "hash", ("a", "b"))
    make_table(root, "prices", "SELECT i::BIGINT AS k, (i * 1.25)::DECIMAL(12,2) AS price, "
               "DATE '2020-01-01' + (i % 365)::INTEGER AS day FROM range(1000) t(i)", 6, "range", ("k",))
    return root
