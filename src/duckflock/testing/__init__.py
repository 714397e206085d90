"""Testing duckflock against single-process DuckDB: tables written as partitions, the oracle, result
comparison, a sqllogictest-style runner, the TPC-H queries, and launchers of Flight workers and
network-namespace hosts. Used by the test suite and the benchmarks; usable by anyone extending them."""
