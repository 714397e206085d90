"""One query across the ranks: the driver (rank 0), each rank's run of the query's stages, the
control messages between them and with a caller, progress, and cancellation."""
