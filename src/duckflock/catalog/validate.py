"""The shape of a catalog file, checked when it is read: a message naming the file, the table and the
field, instead of a KeyError or a wrong answer later.

Each spec maps a field to a kind (a key of ``_KINDS``); a field whose name ends in ``?`` may be absent.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from duckflock.errors import CatalogError

VERSION = 1  # what Catalog.save writes and this duckflock reads


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _items(v: object, kind: Callable[[object], bool]) -> bool:
    return isinstance(v, list) and all(kind(x) for x in v)


def _pair(v: object) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v)


def _values(v: object, kind: Callable[[object], bool]) -> bool:
    return isinstance(v, dict) and all(kind(x) for x in v.values())


# kind: (test, what a value of it is, for the message)
_KINDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "int": (_is_int, "an integer"),
    "int|null": (lambda v: v is None or _is_int(v), "an integer or null"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "strings": (lambda v: _items(v, lambda x: isinstance(x, str)), "a list of strings"),
    "columns": (lambda v: _items(v, _pair), 'a list of ["name", "type"] pairs'),
    "name->str": (lambda v: _values(v, lambda x: isinstance(x, str)), "an object of strings"),
    "name->int": (lambda v: _values(v, _is_int), "an object of integers"),
}
_FILE = {"version": "int", "tables": "object", "meta?": "object"}
_TABLE = {
    "format": "str",
    "columns": "columns",
    "partitions": "list",
    "partitioning?": "object",
    "csv_options?": "object",
    "hive?": "name->str",
    "widths?": "name->int",
    "source?": "object",
    "objects?": "object",
}
_PARTITIONING = {"kind?": "str", "keys?": "strings", "hash_canary?": "int|null", "duckdb?": "str"}
_PARTITION = {"files": "strings", "rows": "int"}
_CHOICES = {"format": ("parquet", "csv"), "kind": ("hash", "range", "none")}


def check_catalog(path: Path, data: object) -> None:
    """Raise CatalogError naming ``path``, the table and the field where ``data`` (the parsed JSON of
    a catalog file) is not a catalog this duckflock reads."""
    _fields(f"{path}: ", data, _FILE)
    assert isinstance(data, dict)
    if data["version"] != VERSION:
        raise CatalogError(
            f"{path}: version {data['version']} is not supported (this duckflock reads version {VERSION})"
        )
    for name, table in data["tables"].items():
        where = f'{path}: table "{name}": '
        _fields(where, table, _TABLE)
        part = table.get("partitioning", {})
        _fields(where + "partitioning: ", part, _PARTITIONING)
        if part.get("kind", "none") != "none" and not part.get("keys"):
            raise CatalogError(f"{where}partitioning: a {part['kind']} table needs its keys")
        for i, partition in enumerate(table["partitions"]):
            _fields(f"{where}partition {i}: ", partition, _PARTITION)


def _fields(where: str, data: object, spec: dict[str, str]) -> None:
    if not isinstance(data, dict):
        raise CatalogError(f"{where}expected an object, got {type(data).__name__}")
    for field, kind in spec.items():
        name = field.removesuffix("?")
        if name not in data:
            if name == field:
                raise CatalogError(f'{where}missing field "{name}"')
            continue
        test, what = _KINDS[kind]
        value = data[name]
        if not test(value):
            raise CatalogError(f'{where}field "{name}" must be {what}, not {value!r:.60}')
        if name in _CHOICES and value not in _CHOICES[name]:
            raise CatalogError(
                f'{where}field "{name}" must be one of {", ".join(_CHOICES[name])}, not {value!r}'
            )
