"""Helpers for tests that talk to a live engine."""

from supervisor.launcher import EngineProcess
from supervisor.workload import wait_dispatched

__all__ = ["parked_requests", "wait_dispatched"]


def parked_requests(engine: EngineProcess) -> int:
    """Pulls and pops parked (long polling) at the owners, from their heartbeats."""
    from engine.ipc.messages import StatusQuery
    from supervisor.control import control

    return sum(a.detail.get("parked_pulls", 0) for a in control(engine.store_dir, StatusQuery()).actors)
