"""SQL text to a logical plan: parse and validate, normalize with sqlglot, build plan nodes."""
