"""duckflock's benchmarks, a project of their own beside the library: the seed join, TPC-H, memory,
Flight and netem against single-process DuckDB, and all-to-all exchange throughput. ``duckflock
bench ...`` parses the arguments and imports ``cli.run`` from here only when a benchmark runs.

Benchmarks measure and report; they never assert timings. Each benchmark is a parent process (e.g.
this package's ``seed`` / ``exchange`` modules) that launches one MPI job per rank count
(``seed_job`` / ``exchange_job``), collects what the job wrote and writes results.json, results.md
and PNG figures. Queries, the DuckDB oracle and result comparison come from ``duckflock.testing``,
the same ones the tests use. GB means 10**9 bytes throughout.
"""
