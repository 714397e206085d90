"""A catalog file that is not one this duckflock reads is refused when loaded, naming the file, the
table and the field."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from duckflock.catalog import Catalog
from duckflock.catalog.catalog import CATALOG_FILE
from duckflock.errors import CatalogError
from duckflock.testing.tables import make_table


@pytest.fixture
def data(tmp_path: Path) -> Path:
    make_table(tmp_path, "orders", "SELECT i AS k, 'x' || i AS s FROM range(20) t(i)", 2, "hash", ("k",))
    return tmp_path


def _edit(data: Path, change: Callable[[dict], object]) -> Path:
    path = data / CATALOG_FILE
    catalog = json.loads(path.read_text())
    change(catalog)
    path.write_text(json.dumps(catalog))
    return path


def _orders(c: dict) -> dict:
    return c["tables"]["orders"]


def test_a_saved_catalog_reads_back(data):
    assert Catalog.load(data).table("orders").rows == 20


def test_another_version_is_refused(data):
    path = _edit(data, lambda c: c.update(version=99))
    with pytest.raises(CatalogError) as e:
        Catalog.load(data)
    assert str(e.value) == f"{path}: version 99 is not supported (this duckflock reads version 1)"


def test_a_missing_field_is_named_with_its_table(data):
    path = _edit(data, lambda c: _orders(c).pop("columns"))
    with pytest.raises(CatalogError) as e:
        Catalog.load(data)
    assert str(e.value) == f'{path}: table "orders": missing field "columns"'


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.pop("version"), 'missing field "version"'),
        (lambda c: c.update(tables=[]), 'field "tables" must be an object'),
        (
            lambda c: _orders(c).update(format="orc"),
            'table "orders": field "format" must be one of parquet, csv',
        ),
        (
            lambda c: _orders(c).update(columns=[["k"]]),
            'table "orders": field "columns" must be a list of ["name", "type"] pairs',
        ),
        (
            lambda c: _orders(c)["partitions"][1].update(rows="12"),
            'table "orders": partition 1: field "rows" must be an integer',
        ),
        (
            lambda c: _orders(c)["partitions"][0].pop("files"),
            'table "orders": partition 0: missing field "files"',
        ),
        (
            lambda c: _orders(c)["partitioning"].update(hash_canary="7"),
            'field "hash_canary" must be an integer or null',
        ),
        (lambda c: _orders(c)["partitioning"].update(keys=[]), "partitioning: a hash table needs its keys"),
        (lambda c: _orders(c).update(widths={"s": 2.5}), 'field "widths" must be an object of integers'),
        (
            lambda c: _orders(c)["partitions"][0].update(min={"date": "not a date"}),
            "Invalid isoformat string",
        ),
    ],
)
def test_a_field_of_the_wrong_type_is_named(data, change, message):
    path = _edit(data, change)
    with pytest.raises(CatalogError, match=r"^" + str(path).replace(".", r"\.") + ": ") as e:
        Catalog.load(data)
    assert message in str(e.value)


def test_the_cli_prints_one_line_naming_the_file(data):
    path = _edit(data, lambda c: c.update(version=99))
    proc = subprocess.run(
        [sys.executable, "-m", "duckflock.cli.main", "explain", "--data", str(data), "SELECT 1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert (
        proc.stderr.strip() == f"error: {path}: version 99 is not supported (this duckflock reads version 1)"
    )
