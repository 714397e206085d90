"""The seed report's workload: a simplified TPC-H Q3 join, used by the demo and the benchmark."""

SEED_QUERY = """SELECT c.c_custkey, c.c_name, o.o_orderkey, o.o_orderdate, o.o_totalprice
FROM customer c
JOIN orders o ON c.c_custkey = o.o_custkey
WHERE o.o_orderdate < DATE '1995-03-15'
ORDER BY o.o_orderdate DESC"""
