"""Helpers for tests that talk to a live engine."""

from __future__ import annotations

import time

from engine.client import StoreClient


def wait_dispatched(client: StoreClient, timeout_ms: int = 10_000) -> dict[str, int]:
    """Block until every owner and the index applied all the writer confirmed (deadline, no sleep)."""
    deadline = time.monotonic() + timeout_ms / 1000
    offsets: dict[str, int] = {}
    while time.monotonic() < deadline:
        offsets = client.status()["offsets"]
        confirmed = offsets["confirmed_offset"]
        if all(v >= confirmed for k, v in offsets.items() if k.endswith("applied_offset")):
            return offsets
    raise AssertionError(f"dispatch did not catch up within {timeout_ms} ms: {offsets}")
