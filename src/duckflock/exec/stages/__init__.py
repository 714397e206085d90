"""One stage on one rank: its life (inputs, DuckDB query), how its rows leave (exchange, part file),
and what decides a stage's run as it goes: measured broadcasts, hot keys, parallel sorts and their
merge, runs per group of partitions, hive pruning, and the accounting of its scans."""
