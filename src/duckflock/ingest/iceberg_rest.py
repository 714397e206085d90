"""pyiceberg's REST catalog with a time bound on every request: pyiceberg sends them without one,
so a catalog that accepts connections and never answers would hang a load or a query. Loaded by
pyiceberg's ``load_catalog`` through its ``py-catalog-impl`` property (ingest/iceberg.py)."""

from __future__ import annotations

import os
from typing import Any

from pyiceberg.catalog.rest import RestCatalog
from requests import PreparedRequest, Response, Session
from requests.adapters import HTTPAdapter


def timeout_s() -> float:
    return float(os.environ.get("DUCKFLOCK_ICEBERG_TIMEOUT_S", "30"))


class _Timeout(HTTPAdapter):
    """Requests sent without a timeout get ``DUCKFLOCK_ICEBERG_TIMEOUT_S`` (connect and read)."""

    def send(
        self,
        request: PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: dict[str, str] | None = None,
    ) -> Response:
        bound = timeout_s() if timeout is None else timeout
        return super().send(request, stream, bound, verify, cert, proxies)


class TimedRestCatalog(RestCatalog):
    def _create_session(self) -> Session:
        session = super()._create_session()
        for prefix in ("http://", "https://"):
            session.mount(prefix, _Timeout())
        return session
