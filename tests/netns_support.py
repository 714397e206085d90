"""Hosts as network namespaces for tests: ``duckflock.testing.netns.Hosts`` that skips the test, with
the reason, where namespaces (or the requested link shaping) cannot be built."""

from __future__ import annotations

import pytest

from duckflock.testing import netns


class Hosts(netns.Hosts):
    """``with Hosts(3, rate="100mbit") as hosts:`` -> ``hosts.prefix(i)``, ``hosts.address(i)``."""

    def __enter__(self) -> Hosts:
        try:
            super().__enter__()
        except netns.ShapingUnavailable as e:  # e.g. a delay on a kernel without sch_netem
            pytest.skip(f"link shaping unavailable: {e}")
        except netns.NamespacesUnavailable as e:
            pytest.skip(f"network namespaces unavailable: {e}")
        return self
