"""How a job started here is shaped (ranks per process) and how a process's death is named."""

from __future__ import annotations

import json

import pytest

from duckflock.errors import DuckflockError
from duckflock.exec.hosting.launch import (
    PER_PROCESS_ENV,
    describe_deaths,
    mpiexec_job,
    owned_temp_dir,
    per_process,
)


def test_ranks_per_process_default_to_all_in_one():
    assert per_process(4, 0) == 4
    assert per_process(4, 2) == 2
    assert per_process(3, 1) == 1


@pytest.mark.parametrize(("ranks", "configured"), [(3, 2), (0, 0), (2, 4)])
def test_ranks_that_do_not_split_are_refused(ranks, configured):
    with pytest.raises(DuckflockError):
        per_process(ranks, configured)


def test_job_starts_one_process_per_group_of_ranks():
    argv, env = mpiexec_job(6, 2, ["-m", "x"])
    assert argv[argv.index("-n") + 1] == "3"
    assert env == {PER_PROCESS_ENV: "2"}


@pytest.mark.parametrize(("k", "named"), [(1, "rank 1 was"), (3, "the process of ranks 3-5 was")])
def test_the_first_death_names_its_ranks(tmp_path, k, named):
    # As exec/hosting/guard.py records them: the process index (PMI_RANK) and the signal.
    (tmp_path / "rank1.died").write_text(json.dumps({"rank": "1", "signal": 9, "time": 2.0, "pid": 7}))
    (tmp_path / "rank0.died").write_text(json.dumps({"rank": "0", "signal": 15, "time": 3.0, "pid": 8}))
    message = describe_deaths(tmp_path, k)
    assert message is not None and message.startswith(f"{named} killed by signal 9 (SIGKILL)")


def test_job_directories_of_dead_owners_are_removed(tmp_path, monkeypatch):
    import os
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / "duckflock-job-999999999-abc"  # no process has this pid
    live = tmp_path / f"duckflock-job-{os.getpid()}-def"
    other = tmp_path / "duckflock-session-999999999-ghi"  # another kind: left to sessions
    for d in (dead, live, other):
        d.mkdir()
    made = owned_temp_dir("job")
    assert not dead.exists() and live.exists() and other.exists()
    assert os.path.basename(made).startswith(f"duckflock-job-{os.getpid()}-")
