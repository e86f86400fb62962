"""Fixtures of the typed client's tests: a live engine (tests/conftest.py) and its endpoint."""

from __future__ import annotations

import pytest

from supervisor.launcher import EngineProcess


@pytest.fixture
def endpoint(engine: EngineProcess) -> str:
    """The endpoint of a fresh engine with topics ``orders`` (4 queues) and ``jobs`` (2 queues)."""
    with engine.client() as client:
        client.create_topic("orders", queue_count=4)
        client.create_topic("jobs", queue_count=2)
    return engine.endpoint
