"""Running plans on ranks: the per-rank runtime, stage execution, the driver and the worker loop."""
