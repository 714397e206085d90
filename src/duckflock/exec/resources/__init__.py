"""What a rank owns: its runtime (transport, multiplexer, DuckDB, catalog), its share of the node's
memory and where it spills, the freed memory handed back, and what the ranks of a process share."""
