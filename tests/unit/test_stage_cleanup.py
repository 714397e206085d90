"""A failed query's connection is interrupted again and again until its rank leaves the query; the
stage's cleanup must still drop its views, or the next query's table of that name is refused."""

import duckdb
import pyarrow as pa
import pytest

from duckflock.local_duckdb import drop_views


class _InterruptedOnce:
    """A real connection whose next ``times`` DROPs are interrupted as they run (the fault the
    interrupting thread causes when its 0.1 s tick lands inside one)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, times: int) -> None:
        self.con, self.times = con, times

    def execute(self, sql: str) -> object:
        if sql.startswith("DROP") and self.times:
            self.times -= 1
            raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")
        return self.con.execute(sql)

    def unregister(self, name: str) -> object:
        return self.con.unregister(name)


def test_views_are_dropped_through_interrupts():
    con = duckdb.connect()
    con.register("__x0_whole", pa.table({"a": [1, 2]}))
    con.execute("CREATE TEMP VIEW __x0 AS SELECT * FROM __x0_whole")
    drop_views(_InterruptedOnce(con, 3), ["__x0"], ["__x0_whole"])  # type: ignore[arg-type]
    con.register("__x0", pa.table({"a": [3]}))  # refused while the view is left behind
    assert con.sql("SELECT a FROM __x0").fetchall() == [(3,)]
    with pytest.raises(duckdb.CatalogException):
        con.sql("SELECT * FROM __x0_whole")


def test_an_endless_interrupt_is_raised():
    con = duckdb.connect()
    con.execute("CREATE TEMP VIEW v AS SELECT 1")
    with pytest.raises(duckdb.InterruptException):
        drop_views(_InterruptedOnce(con, 10_000), ["v"])  # type: ignore[arg-type]
