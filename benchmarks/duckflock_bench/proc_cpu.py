"""CPU seconds (user + system, all threads) of this machine's processes whose command line holds a
string: the ranks of one session (their ``--data`` directory), the S3 server (its port). On a
machine whose cores the ranks and the server share, CPU time, not the wall clock, says how far
any client could go: the server's CPU is taken from the ranks'."""

from __future__ import annotations

import os

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(needle: str) -> float:
    """Summed over the processes running now whose command line contains ``needle``."""
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if needle.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK
    return total
