"""A rank of a storage job (``backends/storage_job.py``): one rank per process, exchanging through
objects at the exchange URI only; rank 0 answers the session as an MPI job's rank 0 does
(``exec/hosting/serve.py``)."""

from __future__ import annotations

import os

import pyarrow as pa

from duckflock.catalog import Catalog
from duckflock.config import Config
from duckflock.errors import DuckflockError
from duckflock.exec.hosting import serve
from duckflock.exec.hosting.launch import STORAGE_JOB_ENV, STORAGE_RANK_ENV, STORAGE_RANKS_ENV
from duckflock.exec.resources.budget import own_anon_bytes
from duckflock.exec.resources.runtime import Runtime


def storage_runtimes(data: str, config: Config) -> list[Runtime]:
    """This process's rank, as its launcher named it in the environment."""
    from duckflock.transport.storage import StorageTransport

    catalog = Catalog.load(data)
    if not config.exchange_uri:
        raise DuckflockError("a storage job needs exchange_uri (DUCKFLOCK_EXCHANGE_URI)")
    rank, size = int(os.environ[STORAGE_RANK_ENV]), int(os.environ[STORAGE_RANKS_ENV])
    try:
        transport = StorageTransport(
            config.exchange_uri, os.environ[STORAGE_JOB_ENV], rank, size, config.peer_timeout_s
        )
    except (OSError, pa.ArrowException) as e:  # said once, by the backend, as why the job did not start
        raise DuckflockError(f"cannot exchange through {config.exchange_uri}: {e}") from None
    # The launcher starts every rank on this machine: each takes its share of it.
    return [Runtime.create(transport, catalog, config, size, own_anon_bytes())]


if __name__ == "__main__":
    serve.main(storage_runtimes)
