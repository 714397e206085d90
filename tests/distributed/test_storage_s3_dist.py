"""The storage exchange through an S3 bucket (moto's server): rank processes that share only a
bucket prefix give DuckDB's answers, and leave no object under the prefix, after a query and after
a failure on one rank."""

from __future__ import annotations

import pytest
from test_queries_dist import TPCH_JOINS
from test_storage_dist import assert_cli_error_names_the_rank

import duckflock
from s3_support import bucket
from support import assert_same, oracle

pytestmark = pytest.mark.dist

BUCKET = "exchange"
PREFIX = "tmp/"
URI = f"s3://{BUCKET}/{PREFIX}"


@pytest.fixture(scope="module")
def s3():
    with bucket(BUCKET) as c:  # the ranks inherit its environment
        yield c


def keys(s3) -> list[str]:  # type: ignore[no-untyped-def]
    """Every key under the prefix, directory markers included."""
    return [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX).get("Contents", [])]


def test_tpch_joins_over_an_s3_exchange_match_duckdb(s3, tpch_dir):
    ref = oracle(tpch_dir)
    config = {"exchange_uri": URI, "broadcast_threshold_bytes": 0}  # every join shuffles
    with duckflock.connect(str(tpch_dir), ranks=2, transport="storage", config=config) as db:
        for query, order in TPCH_JOINS[:3]:
            assert_same(db.sql(query).arrow(), ref.sql(query).to_arrow_table(), order)
        assert keys(s3), "the job's objects are in the bucket while the session runs"
    assert keys(s3) == []


def test_error_on_one_rank_leaves_no_objects(s3, bad_dir):
    assert_cli_error_names_the_rank(bad_dir, 2, URI)
    assert keys(s3) == []
