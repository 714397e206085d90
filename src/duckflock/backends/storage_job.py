"""Ranks that share no network, only a directory or bucket (``transport/storage.py``): a job of
rank processes on this machine, started by ``exec/hosting/storage_launch.py`` as mpiexec starts an MPI
job's, served to this process as an MPI job is (``backends/mpi_job.py``, ``exec/hosting/serve.py``: a local
socket to rank 0). The job's objects at the exchange URI are removed when the session ends, and
when it could not start."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from duckflock.backends.mpi_job import Job, MpiJobBackend
from duckflock.exec.hosting.launch import STORAGE_JOB_ENV, STORAGE_RANKS_ENV


def start(
    data: str, ranks: int, uri: str, config_env: dict[str, str], start_timeout: float
) -> StorageJobBackend:
    """A session on a new job of ``ranks`` rank processes over the data directory ``data`` that
    exchange through objects under ``uri``, once its rank 0 is ready (within ``start_timeout``)."""
    uri = uri if "://" in uri else os.path.abspath(uri)  # the ranks may run elsewhere
    name = f"duckflock-{os.getpid()}-{secrets.token_hex(6)}"
    env = {**config_env, "DUCKFLOCK_EXCHANGE_URI": uri, STORAGE_JOB_ENV: name, STORAGE_RANKS_ENV: str(ranks)}
    if "DUCKFLOCK_TIME_ZONE" not in env and not os.environ.get("DUCKFLOCK_TIME_ZONE"):
        from duckflock.local_duckdb import local_time_zone

        env["DUCKFLOCK_TIME_ZONE"] = local_time_zone()  # every rank takes the caller's zone
    try:
        job = StorageJobBackend.launch(data, ranks, 1, env, start_timeout)
    except BaseException:
        _remove_objects(uri, name)
        raise
    return StorageJobBackend(job, uri, name)


class StorageJobBackend(MpiJobBackend):
    kind = "storage job"
    serve_module = "duckflock.exec.hosting.storage_serve"
    _own_group = True

    def __init__(self, job: Job, uri: str, name: str):
        """A session on a started job whose objects are under ``uri``/``name`` (``start`` starts one)."""
        super().__init__(job)
        self._uri, self._job = uri, name

    @classmethod
    def _command(
        cls, ranks: int, per_process: int, python_args: list[str], directory: str
    ) -> tuple[list[str], dict[str, str]]:
        launcher = str(Path(__file__).parent.parent / "exec" / "hosting" / "storage_launch.py")
        return [sys.executable, "-I", "-S", launcher, directory, str(ranks), sys.executable, *python_args], {}

    def _exit_reason(self, code: int) -> str:
        """The rank whose failure ended the job (the launcher records it), else the exit code."""
        for f in sorted(Path(self._dir).glob("rank*.exited")):
            return f"{f.stem} exited with code {f.read_text()}"
        return f"exit code {code}"

    def _stop_job(self) -> None:
        try:
            super()._stop_job()
        finally:
            _remove_objects(self._uri, self._job)

    def close(self) -> None:
        try:
            super().close()
        finally:
            _remove_objects(self._uri, self._job)


def _remove_objects(uri: str, job: str) -> None:
    from duckflock.transport.storage import remove_job

    remove_job(uri, job)
