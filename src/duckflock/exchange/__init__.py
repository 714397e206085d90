"""Moving record batches between ranks: the multiplexer, partitioning, serialization, shuffles."""
