"""Testing duckflock against single-process DuckDB: tables written as partitions, the oracle, result
comparison and a sqllogictest-style runner. Used by the test suite; usable by anyone extending it."""
