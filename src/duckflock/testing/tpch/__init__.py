"""The TPC-H workload the tests, the demo and the benchmarks share: the 22 queries (the
specification's texts with its validation parameters, as package data) and the seed report's join."""

from __future__ import annotations

from importlib import resources

# The seed report's workload: a simplified TPC-H Q3 join.
SEED_QUERY = """SELECT c.c_custkey, c.c_name, o.o_orderkey, o.o_orderdate, o.o_totalprice
FROM customer c
JOIN orders o ON c.c_custkey = o.o_custkey
WHERE o.o_orderdate < DATE '1995-03-15'
ORDER BY o.o_orderdate DESC"""
SEED_ORDER = ["o_orderdate"]

# Output columns whose sequence each query's ORDER BY fixes (ties aside).
ORDER = {
    1: ["l_returnflag", "l_linestatus"],
    2: ["s_acctbal"],
    3: ["revenue"],
    4: ["o_orderpriority"],
    5: ["revenue"],
    7: ["supp_nation", "cust_nation", "l_year"],
    8: ["o_year"],
    9: ["nation", "o_year"],
    10: ["revenue"],
    11: ["value"],
    12: ["l_shipmode"],
    13: ["custdist", "c_count"],
    15: ["s_suppkey"],
    16: ["supplier_cnt"],
    18: ["o_totalprice"],
    20: ["s_name"],
    21: ["numwait"],
    22: ["cntrycode"],
}


def query(n: int) -> str:
    return resources.files(__package__).joinpath(f"q{n:02d}.sql").read_text()


def queries() -> dict[int, str]:
    return {n: query(n) for n in range(1, 23)}
