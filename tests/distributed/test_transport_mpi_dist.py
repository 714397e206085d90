"""The MPI transport on real ranks: multi-part messages arrive whole, and each source's messages
arrive in the order sent (ordered gathers depend on it). MPICH here usually completes receives in
order anyway, so the order check guards the contract rather than forcing a reordering."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from duckflock.exec.hosting.launch import mpiexec_argv

JOB = Path(__file__).with_name("mpi_order_job.py")


@pytest.mark.parametrize("ranks", [2, 3])
def test_multipart_messages_arrive_whole_and_in_order(ranks):
    proc = subprocess.run(mpiexec_argv(ranks, [str(JOB)]), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize(("processes", "per_process"), [(2, 2), (2, 3), (1, 3)])
def test_ranks_as_threads_of_processes_keep_each_senders_order(processes, per_process):
    """Several ranks per process send at once, to ranks of their own process (in memory) and of
    the other (MPI, one communicator per pair of threads): every message arrives whole, in order."""
    argv = mpiexec_argv(processes, [str(JOB), str(per_process)])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
