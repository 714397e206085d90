"""String widths measured when a table is written feed the planner's size estimates."""

from __future__ import annotations

import json

import duckdb

from duckflock.catalog import Catalog, PartitionInfo, TableInfo
from duckflock.catalog.catalog import CATALOG_FILE
from duckflock.ingest.widths import with_widths
from support import make_table


def test_string_widths_are_measured_and_kept_in_the_catalog(tmp_path):
    make_table(tmp_path, "t", "SELECT i AS k, repeat('x', 100) AS long, 'ab' AS short FROM range(50) t(i)", 2)
    info = Catalog.load(tmp_path).table("t")
    assert dict(info.widths) == {"long": 104, "short": 6}  # bytes and an Arrow offset
    assert info.row_width(["long"]) == 104 and info.row_width(["k", "short"]) == 8 + 6


def test_a_catalog_without_widths_estimates_strings_by_type(tmp_path):
    make_table(tmp_path, "t", "SELECT i AS k, repeat('x', 100) AS long FROM range(50) t(i)", 2)
    path = tmp_path / CATALOG_FILE
    data = json.loads(path.read_text())
    del data["tables"]["t"]["widths"]
    path.write_text(json.dumps(data))
    assert Catalog.load(tmp_path).table("t").row_width(["long"]) == 24


def test_a_table_that_cannot_be_read_keeps_widths_by_type(tmp_path):
    """Widths are estimates: a failure to measure must never fail the load that wrote the table."""
    info = TableInfo("t", "parquet", (("s", "VARCHAR"),), (PartitionInfo(("missing.parquet",), 5),))
    with duckdb.connect() as con:
        assert with_widths(con, info, tmp_path).widths == ()
