"""Under mpiexec: open each rank's runtime (its memory limit and time zone from its own environment)
and print what the ranks must agree on: ``bound <rank> <bytes>`` (the planner's broadcast bound)
and ``zone <rank> <TimeZone>`` (its DuckDB's)."""

from __future__ import annotations

import sys

from duckflock.config import Config
from duckflock.exec.resources.runtime import mpi_runtimes


def main() -> None:
    (rt,) = mpi_runtimes(None, Config.from_env())
    try:
        # One write per line: unbuffered (PYTHONUNBUFFERED), print writes the newline apart, and
        # mpiexec forwards each write as it comes, so two ranks' lines could run together.
        sys.stdout.write(f"bound {rt.rank} {rt.config.broadcast_max_bytes}\n")
        zone = rt.con.execute("SELECT current_setting('TimeZone')").fetchall()[0][0]
        sys.stdout.write(f"zone {rt.rank} {zone}\n")
        sys.stdout.flush()
    finally:
        rt.close()


if __name__ == "__main__":
    main()
