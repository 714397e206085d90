"""The planner's rewrite passes (sql/passes.py): listed in order, each one switched off changes what
planning does, and EXPLAIN VERBOSE shows the query after each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from duckflock.catalog import Catalog
from duckflock.config import Config
from duckflock.errors import InternalError, NotDistributed
from duckflock.plan.explain import explain_plan
from duckflock.plan.planner import plan_query
from duckflock.sql import passes
from duckflock.sql.passes import Step, format_trace
from duckflock.sql.schema_db import SchemaDB
from support import make_table

EXISTS = (
    "SELECT k, count(*) AS n FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k AND b.v > 2) GROUP BY k"
)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root: Path = tmp_path_factory.mktemp("passes")
    make_table(root, "a", "SELECT i::BIGINT AS k, i % 7 AS v FROM range(1000) t(i)", 4, "hash", ("k",))
    make_table(root, "b", "SELECT i::BIGINT AS k, i % 5 AS v FROM range(1000) t(i)", 4, "hash", ("k",))
    return root


@pytest.fixture(scope="module")
def plan(data):
    catalog = Catalog.load(str(data))
    schema_db = SchemaDB(catalog)

    def run(sql: str, **kwargs):
        return plan_query(sql, catalog, schema_db, 4, Config(driver_fallback_bytes=-1), 1, 2, **kwargs)

    yield run
    schema_db.close()


def test_the_pipeline_is_listed_in_order_with_a_description_each():
    names = passes.names()
    assert names == [p.name for p in passes.PREPARE + passes.NORMALIZE]
    assert len(set(names)) == len(names)
    assert names[0] == "round_trip"
    # sqlglot's qualify comes before the rewrites that read qualified columns.
    assert names.index("qualify") < names.index("exists_to_semi_join") < names.index("pushdown_predicates")
    assert names[-1] == "quote_identifiers"
    assert all(p.description for p in passes.PIPELINE)


def test_a_pass_switched_off_changes_the_plan(plan):
    assert "Join semi" in explain_plan(plan(EXISTS))
    # Without the rewrite the EXISTS stays a correlated subquery, which DuckDB evaluates inline.
    assert "Join semi" not in explain_plan(plan(EXISTS, disabled_passes={"exists_to_semi_join"}))


def test_a_pass_switched_off_can_leave_a_query_refused(plan):
    sql = "SELECT DISTINCT ON (v) v, k FROM a ORDER BY v, k"
    assert plan(sql).on_driver is None
    with pytest.raises(NotDistributed, match="DISTINCT ON"):
        plan(sql, disabled_passes={"distinct_on_as_qualify"})


def test_an_unknown_pass_is_named(plan):
    with pytest.raises(InternalError, match="no pass named nope"):
        plan("SELECT k FROM a", disabled_passes={"nope"})


def test_the_trace_shows_each_pass_and_changes_nothing(plan):
    trace: list[Step] = []
    traced = plan(EXISTS, trace=trace)
    assert explain_plan(traced) == explain_plan(plan(EXISTS))
    assert [s.name for s in trace] == passes.names()
    changed = {s.name: s.sql for s in trace if s.sql is not None}
    assert "SEMI JOIN" in changed["exists_to_semi_join"] and "EXISTS" in changed["qualify"]
    assert "plain_positions" not in changed  # nothing to rewrite in this query
    shown = format_trace(trace)
    assert "  exists_to_semi_join:\n    SELECT" in shown
    assert "checks passed: round_trip, supported" in shown
    assert "no change: fix_clock, plain_positions" in shown


def test_the_trace_says_which_passes_were_left_out_and_which_refused(plan):
    trace: list[Step] = []
    plan(EXISTS, disabled_passes={"normalize"}, trace=trace)
    assert Step("normalize", None, "switched off") in trace
    trace = []
    with pytest.raises(NotDistributed):
        plan("SELECT a.k FROM a POSITIONAL JOIN b", trace=trace)
    assert trace[-1] == Step("supported", None, "refused the query")
    assert "refused the query: supported" in format_trace(trace)


def test_explain_verbose_prints_the_passes_before_the_stages(data):
    query = "SELECT k FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k)"
    cmd = [sys.executable, "-m", "duckflock.cli.main", "explain", "--verbose", "--data", str(data), query]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("Passes (the query after each one that changed it):\n  qualify:\n")
    assert out.index("  exists_to_semi_join:") < out.index("Stage 0 on all ranks")
    assert "no change: " in out and "Join semi" in out
    proc = subprocess.run([*cmd[:4], "--analyze", *cmd[4:]], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "not with --analyze or --workers" in proc.stderr
