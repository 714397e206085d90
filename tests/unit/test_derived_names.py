"""The renaming of repeated output names agrees with DuckDB's own, for any list of names."""

from __future__ import annotations

import duckdb
from hypothesis import given, settings
from hypothesis import strategies as st

from duckflock.sql.derived_names import duckdb_unique
from duckflock.sqltext import quote_ident

_con = duckdb.connect()
_names = st.lists(
    st.sampled_from(["k", "K", "k_1", "K_1", "k_2", "k_1_1", "a", "a_1"]), min_size=1, max_size=7
)


@settings(max_examples=200, deadline=None)
@given(_names)
def test_duckdb_unique_matches_duckdb(names: list[str]) -> None:
    select = ", ".join(f"1 AS {quote_ident(n)}" for n in names)
    assert duckdb_unique(names) == _con.sql(f"SELECT * FROM (SELECT {select})").columns
