"""Helpers for tests that talk to a live engine."""

from supervisor.workload import wait_dispatched

__all__ = ["wait_dispatched"]
