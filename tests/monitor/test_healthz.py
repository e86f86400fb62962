"""``/healthz`` on both of the monitor's ports: 200 while every actor runs, 503 and the states
while one does not (killed and waiting for its restart), 200 again once it is back."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.ipc.control import EventStream
from harness.faults import kill_actor
from tests.monitor.conftest import Monitored, monitored_engine

pytestmark = pytest.mark.timeout(60)


def healthz(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture
def slow_restarts(store_dir: Path) -> Iterator[Monitored]:
    # an actor's second restart within the window waits 3 s: long enough to see it down
    with monitored_engine(store_dir, restart_backoff_ms=3_000) as monitored:
        yield monitored


def test_healthz_is_503_while_an_actor_is_down_and_200_when_all_run(slow_restarts: Monitored) -> None:
    monitored = slow_restarts
    ports = [f"http://{monitored.engine.config.metrics_endpoint}", monitored.dashboard_url]
    for url in ports:
        assert healthz(url) == (200, "RUNNING\n")
    store_dir = monitored.engine.store_dir
    events = EventStream(store_dir)
    try:
        kill_actor(store_dir, "timer")
        events.wait_for("actor.running", name="timer")  # the first restart is at once
        events.wait_for("actor.exited", name="timer")  # the first exit's event, kept while waiting
        kill_actor(store_dir, "timer")
        events.wait_for("actor.exited", name="timer")
        for url in ports:
            status, body = healthz(url)
            assert status == 503 and body.splitlines() == ["DEGRADED", "timer DOWN"], body
        events.wait_for("actor.running", name="timer", timeout_ms=20_000)
    finally:
        events.close()
    for url in ports:
        assert healthz(url) == (200, "RUNNING\n")
