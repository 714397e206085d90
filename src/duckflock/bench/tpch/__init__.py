"""The 22 TPC-H queries (the specification's texts with its validation parameters)."""

from __future__ import annotations

from importlib import resources


def query(n: int) -> str:
    return resources.files(__package__).joinpath(f"q{n:02d}.sql").read_text()


def queries() -> dict[int, str]:
    return {n: query(n) for n in range(1, 23)}
