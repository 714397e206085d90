"""Run under mpiexec: execute a JSON list of queries on all ranks; rank 0 writes each result as an
Arrow file (or the error text) for the test to compare with single-process DuckDB."""

import json
import sys
from pathlib import Path

import pyarrow as pa
from mpi4py import MPI

import duckflock

data, spec, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
queries = json.loads(spec.read_text())
with duckflock.spmd(data) as db:
    if db is not None:
        for i, q in enumerate(queries):
            try:
                table = db.sql(q).arrow()
            except duckflock.DuckflockError as e:
                (out / f"{i}.err").write_text(f"{type(e).__name__}: {e}")
                continue
            with pa.ipc.new_file(str(out / f"{i}.arrow"), table.schema) as w:
                w.write_table(table)

# The packages this rank loaded, for tests of what ranks import.
rank = MPI.COMM_WORLD.Get_rank()
(out / f"rank{rank}.modules").write_text("\n".join(sorted({m.split(".")[0] for m in sys.modules})))
