"""Under mpiexec: open each rank's runtime (its memory limit from its own environment) and print
the broadcast bound the planner would use there: ``bound <rank> <bytes>``."""

from __future__ import annotations

from duckflock.config import Config
from duckflock.exec.runtime import mpi_runtime


def main() -> None:
    rt = mpi_runtime(None, Config.from_env())
    try:
        print(f"bound {rt.rank} {rt.config.broadcast_max_bytes}", flush=True)
    finally:
        rt.close()


if __name__ == "__main__":
    main()
