"""Benchmarks: the seed join against single-process DuckDB, and all-to-all exchange throughput.

Benchmarks measure and report; they never assert timings. Each benchmark is a parent process (this
package's ``seed`` / ``exchange`` modules) that launches one MPI job per rank count
(``seed_job`` / ``exchange_job``), collects what the job wrote and writes results.json, results.md
and PNG figures. GB means 10**9 bytes throughout.
"""
