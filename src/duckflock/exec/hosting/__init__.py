"""The processes that run ranks and their lifetime: launching a job (mpiexec, a forked child, a
storage job), the guard that reports how a process died, a process's ranks as threads, and the
serving loops of an MPI job's rank 0, a Flight worker and a storage job's rank."""
