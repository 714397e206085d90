"""Prepared statements' ``?`` values written into the query text (flightsql/params.py): each comes
back from DuckDB as the client sent it."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import duckdb
import pyarrow as pa
import pytest

from duckflock.errors import DuckflockError
from duckflock.flightsql.params import bind, bind_nulls, parameter_schema, parameter_types, placeholders

VALUES = pa.table(
    {
        "i8": pa.array([-5], pa.int8()),
        "u64": pa.array([2**64 - 1], pa.uint64()),
        "f": pa.array([0.1], pa.float64()),
        "inf": pa.array([float("-inf")], pa.float64()),
        "dec": pa.array([Decimal("-12345.678")], pa.decimal128(10, 3)),
        "s": pa.array(["it's a '?' -- not a comment"]),
        "blob": pa.array([b"\x00\xff'"], pa.binary()),
        "b": pa.array([True]),
        "d": pa.array([dt.date(1995, 3, 15)]),
        "t": pa.array([dt.time(23, 59, 58, 123456)]),
        "ts": pa.array([dt.datetime(2024, 2, 29, 12, 0, 1, 5)], pa.timestamp("us")),
        "tz": pa.array([dt.datetime(2024, 2, 29, 12, 0, tzinfo=dt.UTC)], pa.timestamp("us", tz="UTC")),
        "list": pa.array([[1, None, 3]], pa.list_(pa.int32())),
        "null": pa.array([None], pa.null()),
        "null_int": pa.array([None], pa.int64()),
    }
)


@pytest.mark.parametrize("name", VALUES.column_names)
def test_each_value_reaches_the_query_as_sent(name):
    (query,) = bind("SELECT ? AS v", VALUES.select([name]))
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    got = con.sql(query).to_arrow_table().column("v")
    want = VALUES.column(name)
    assert got.cast(want.type).to_pylist() == want.to_pylist(), query


def test_only_placeholder_tokens_are_replaced():
    text = "SELECT '?' AS a, ? AS b, \"c?\" -- ?\nFROM t WHERE x = ?"
    assert len(placeholders(text)) == 2
    (query,) = bind(text, pa.table({"p": [1], "q": ["x"]}))
    assert query == "SELECT '?' AS a, CAST('1' AS BIGINT) AS b, \"c?\" -- ?\nFROM t WHERE x = 'x'"
    assert bind_nulls(text) == "SELECT '?' AS a, NULL AS b, \"c?\" -- ?\nFROM t WHERE x = NULL"


def test_text_takes_the_type_of_where_it_stands():
    con = duckdb.connect()
    cases = [("SELECT 2 * 3 > ?", "5"), ("SELECT date_trunc('month', DATE '1995-01-15') >= ?", "1995-01-01")]
    for sql, text in cases:  # a VARCHAR compared with an INTEGER or a TIMESTAMP is refused
        (query,) = bind(sql, pa.table({"p": [text]}))
        assert con.execute(query).fetchall() == [(True,)], query


def test_several_rows_give_a_query_each_and_a_wrong_count_is_refused():
    assert bind("SELECT ?", pa.table({"p": [1, 2]})) == [
        "SELECT CAST('1' AS BIGINT)",
        "SELECT CAST('2' AS BIGINT)",
    ]
    with pytest.raises(DuckflockError, match=r"the query has 2 parameters \(\?\), 1 value was bound"):
        bind("SELECT ?, ?", pa.table({"p": [1]}))


def test_parameter_types_come_from_the_column_compared_or_the_cast():
    columns = {"k": "BIGINT", "d": "DATE", "p": "DECIMAL(15,2)"}
    sql = (
        "WITH c AS (SELECT CAST(? AS DATE) AS x) SELECT * FROM t, c "
        "WHERE k = ? AND ? < p AND d BETWEEN ? AND ? AND k IN (?, 3) AND ? + 1 > 0 AND nosuch = ?"
    )
    assert parameter_types(sql, columns) == [
        "DATE",
        "BIGINT",
        "DECIMAL(15,2)",
        "DATE",
        "DATE",
        "BIGINT",
        None,
        None,
    ]
    schema = parameter_schema(parameter_types(sql, columns))
    assert schema.names == [str(i) for i in range(1, 9)]
    assert schema.types[:3] == [pa.date32(), pa.int64(), pa.decimal128(15, 2)]
    assert schema.types[-1] == pa.string()  # unknown: text
