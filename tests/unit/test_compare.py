"""The comparison every distributed result goes through: it must find real differences and must
not report rows as different because of how it pairs them."""

import duckdb
import pyarrow as pa

from duckflock.testing.compare import difference


def _table(sql: str) -> pa.Table:
    return duckdb.sql(sql).to_arrow_table()


def test_floats_that_round_alike_still_pair_up():
    # 0.1 as a DOUBLE and as a FLOAT tie when rounded for sorting; pairing them by that order
    # reported equal results as different.
    a = _table("SELECT * FROM (VALUES (0.1::DOUBLE), (0.1::FLOAT::DOUBLE), (0.3::DOUBLE)) t(k)")
    b = _table("SELECT * FROM (VALUES (0.1::FLOAT::DOUBLE), (0.3::DOUBLE), (0.1::DOUBLE)) t(k)")
    assert difference(a, b) is None


def test_last_bit_float_differences_are_tolerated_and_real_ones_found():
    a = _table("SELECT * FROM (VALUES (1, 0.1::DOUBLE + 0.2::DOUBLE), (2, 5.0::DOUBLE)) t(i, x)")
    b = _table("SELECT * FROM (VALUES (2, 5.0::DOUBLE), (1, 0.3::DOUBLE)) t(i, x)")
    c = _table("SELECT * FROM (VALUES (2, 5.0::DOUBLE), (1, 0.31::DOUBLE)) t(i, x)")
    assert difference(a, b) is None
    assert difference(a, c) is not None


def test_dates_without_a_python_value_are_compared():
    a = _table(
        "SELECT * FROM (VALUES ('infinity'::DATE, TIMESTAMP '294000-01-01'), ('2024-01-01'::DATE, NULL)) t(d, ts)"
    )
    b = _table(
        "SELECT * FROM (VALUES ('2024-01-01'::DATE, NULL), ('infinity'::DATE, TIMESTAMP '294000-01-01')) t(d, ts)"
    )
    c = _table(
        "SELECT * FROM (VALUES ('2024-01-01'::DATE, NULL), ('-infinity'::DATE, TIMESTAMP '294000-01-01')) t(d, ts)"
    )
    assert difference(a, b) is None
    assert difference(a, c) is not None
