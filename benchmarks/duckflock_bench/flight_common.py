"""What ``bench flight`` and ``bench netem`` share: their queries, the TPC-H data, and report bits."""

from __future__ import annotations

import re
from pathlib import Path

from duckflock.errors import DuckflockError
from duckflock.testing.tpch import ORDER, SEED_ORDER, SEED_QUERY, query
from duckflock_bench.seed import data_dir

# Columns whose order each query's ORDER BY fixes (the rest is compared as a multiset); other
# queries are compared as multisets only.
ORDER_BY = {"seed": SEED_ORDER, **{f"q{n}": ORDER[n] for n in (3, 5, 9, 18)}}


def query_names(text: str) -> list[str]:
    """``--queries``: ``"seed,q3"`` -> ["seed", "q3"]."""
    names = [q.strip().lower() for q in text.split(",") if q.strip()]
    for q in names:
        if q != "seed" and not (re.fullmatch(r"q\d+", q) and 1 <= int(q[1:]) <= 22):
            raise DuckflockError(f"unknown query {q!r}: use seed or q1..q22")
    if not names:
        raise DuckflockError("--queries is empty")
    return names


def query_text(name: str) -> str:
    return SEED_QUERY if name == "seed" else query(int(name[1:]))


def ensure_data(data_root: Path, sf: float) -> Path:
    """The (absolute) TPC-H directory of ``sf`` under ``data_root``, generated unless already there."""
    from duckflock.ingest.tpch import generate_tpch

    data = data_dir(data_root, sf).resolve()
    generate_tpch(sf, data, parts=12, progress=True)  # a no-op when the data is already there
    return data


def first_line(e: BaseException) -> str:
    """``Type: first line of the message``, for the errors list and progress lines."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def header(machine: dict, vers: dict) -> list[str]:
    return [
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gb']} GB RAM; load "
        f"average at start {machine.get('load_average_at_start')}.",
        f"Versions: duckdb {vers.get('duckdb')}, pyarrow {vers.get('pyarrow')}, mpi4py {vers.get('mpi4py')}.",
    ]


def yes(ok: bool) -> str:
    return "yes" if ok else "**NO**"
