"""Where a query's result goes when it is written to files: part files per rank, or one file the
driver streams into, written by DuckDB's own COPY."""
