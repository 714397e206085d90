"""Golden snapshots of ``explain_plan`` for representative queries over a fixed small catalog.

Regenerate after an intended planner change with ``DUCKFLOCK_UPDATE_GOLDEN=1 pytest tests/unit -k golden``
and review the diff of tests/unit/golden/*.txt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from duckflock.catalog import Catalog
from duckflock.config import Config
from duckflock.plan.explain import explain_plan
from duckflock.plan.planner import plan_query
from duckflock.sql.schema_db import SchemaDB
from support import make_table

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("DUCKFLOCK_UPDATE_GOLDEN") == "1"
RANKS = 4

# name -> (SQL, Config overrides). Row counts are fixed, so size estimates and strategies are stable.
QUERIES: dict[str, tuple[str, dict[str, object]]] = {
    "colocated_join_topk": (
        "SELECT o.k, count(*) AS n, sum(l.qty) AS total FROM orders o JOIN lines l ON o.k = l.k "
        "GROUP BY o.k ORDER BY total DESC, o.k LIMIT 10",
        {},
    ),
    "shuffle_join_partial_final": (
        "SELECT e.grp, count(*) AS n, avg(o.price) AS avg_price FROM events e JOIN orders o ON e.k = o.k "
        "WHERE e.grp < 5 GROUP BY e.grp",
        {"broadcast_threshold_bytes": 0},
    ),
    "replicated_small_side_distinct": (
        "SELECT DISTINCT c.name FROM events e JOIN colors c ON e.color = c.id WHERE c.id > 1",
        {},
    ),
    "count_distinct_window": (
        "SELECT grp, count(DISTINCT k) AS d, rank() OVER (ORDER BY count(DISTINCT k) DESC) AS r "
        "FROM events GROUP BY grp HAVING count(*) > 1",
        {},
    ),
}


def build_catalog(root: Path) -> None:
    make_table(
        root,
        "orders",
        "SELECT i::BIGINT AS k, (i % 97) * 1.5 AS price FROM range(2000) t(i)",
        4,
        "hash",
        ("k",),
    )
    make_table(
        root,
        "lines",
        "SELECT (i // 3)::INTEGER AS k, (i % 11)::INTEGER AS qty FROM range(6000) t(i)",
        4,
        "hash",
        ("k",),
    )
    make_table(
        root,
        "events",
        "SELECT (i * 7 % 2000)::BIGINT AS k, (i % 10)::INTEGER AS grp, (i % 4)::INTEGER AS color "
        "FROM range(3000) t(i)",
        4,
    )
    make_table(root, "colors", "SELECT i::INTEGER AS id, 'color-' || i AS name FROM range(4) t(i)", 1)


def explain_all(root: Path, names: list[str]) -> dict[str, str]:
    catalog = Catalog.load(root)
    db = SchemaDB(catalog)
    try:
        out = {}
        for name in names:
            sql, overrides = QUERIES[name]
            out[name] = explain_plan(plan_query(sql, catalog, db, RANKS, Config(**overrides))) + "\n"
        return out
    finally:
        db.close()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("golden")
    build_catalog(root)
    return root


@pytest.mark.parametrize("name", list(QUERIES))
def test_explain_matches_golden(data, name):
    text = explain_all(data, [name])[name]
    path = GOLDEN / f"{name}.txt"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"no snapshot {path}; create it with DUCKFLOCK_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"explain output of {name!r} changed; if intended, regenerate goldens"


def test_explain_is_independent_of_what_was_planned_before(data):
    """Internal names (__a1, __px1, x0, ...) come from per-plan counters: planning other queries first,
    or the same query twice, gives the same text."""
    names = list(QUERIES)
    forward = explain_all(data, names)
    backward = explain_all(data, names[::-1] + names)
    assert forward == backward


def test_explain_is_the_same_in_another_process(data):
    """A fresh interpreter with another hash seed, planning in reverse order, prints the same plans."""
    names = list(QUERIES)[::-1]
    here = Path(__file__).parent
    code = (
        "import json, sys; from pathlib import Path; import test_explain_golden as g; "
        "print(json.dumps(g.explain_all(Path(sys.argv[1]), sys.argv[2:])))"
    )
    env = {
        **os.environ,
        "PYTHONHASHSEED": "4242",
        "PYTHONPATH": os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", code, str(data), *names], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == explain_all(data, names)
