"""The monitor's HTTP servers under a burst of connections: a few hundred half-sent requests,
held open and then closed together, neither stop the monitor's heartbeat (the supervisor
would kill it) nor keep a scrape from being answered."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.ipc.control import ControlTimeout, EventStream, control
from engine.ipc.messages import ActorStatus, StatusQuery
from tests.monitor.conftest import Monitored, monitored_engine

BURST = 500
SCRAPE_BOUND_S = 3.0


def monitor_status(store_dir: Path) -> ActorStatus:
    [monitor] = [a for a in control(store_dir, StatusQuery()).actors if a.name == "monitor"]
    return monitor


@pytest.fixture
def burst_monitored(store_dir: Path) -> Iterator[Monitored]:
    # the monitor must answer its heartbeat within 2 s, not 5: a starved one is found sooner
    with monitored_engine(store_dir, heartbeat_timeout_ms=2_000, http_connections_max=64,
                          http_request_timeout_ms=1_000) as monitored:
        yield monitored


def half_sent(endpoint: str, count: int) -> list[socket.socket]:
    host, _, port = endpoint.rpartition(":")
    opened = []
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=5)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no blank line: the request never ends
        opened.append(sock)
    return opened


def timed_scrape(monitored: Monitored, url: str) -> float:
    start = time.monotonic()
    monitored.scrape(url=url)
    return time.monotonic() - start


@pytest.mark.timeout(60)
@pytest.mark.parametrize("port", ["metrics", pytest.param("dashboard", marks=pytest.mark.slow)])
def test_a_burst_of_half_sent_requests_neither_starves_the_monitor_nor_its_scrapes(
        burst_monitored: Monitored, port: str) -> None:
    monitored = burst_monitored
    store_dir = monitored.engine.store_dir
    url = monitored.metrics_url if port == "metrics" else monitored.dashboard_url + "/metrics"
    config = monitored.engine.config
    endpoint = config.metrics_endpoint if port == "metrics" else config.dashboard_endpoint
    monitored.scrape(url=url)
    before = monitor_status(store_dir)
    assert before.lifecycle == "RUNNING"
    events = EventStream(store_dir)
    opened = half_sent(endpoint, BURST)
    try:
        # while they are open, a scrape is answered, and soon
        assert timed_scrape(monitored, url) < SCRAPE_BOUND_S
    finally:
        for sock in opened:
            sock.close()  # all together: each half-sent request now ends
    try:
        assert timed_scrape(monitored, url) < SCRAPE_BOUND_S
        # the monitor's heartbeat never stopped for longer than heartbeat_timeout_ms: no kill, no restart
        with pytest.raises(ControlTimeout):
            exited = events.wait_for("actor.exited", name="monitor", timeout_ms=4_000)
            pytest.fail(f"the monitor exited ({exited.exit_code}) after the burst")
    finally:
        events.close()
    after = monitor_status(store_dir)
    assert (after.pid, after.restarts, after.lifecycle) == (before.pid, before.restarts, "RUNNING")
    assert timed_scrape(monitored, url) < SCRAPE_BOUND_S


@pytest.mark.timeout(30)
def test_an_idle_connection_is_closed_after_the_request_timeout(burst_monitored: Monitored) -> None:
    config = burst_monitored.engine.config
    [idle] = half_sent(config.metrics_endpoint, 1)
    with idle:
        idle.settimeout(config.http_request_timeout_ms / 1000 + 2)
        start = time.monotonic()
        assert idle.recv(1024) == b""  # the server closed it, having answered nothing
        assert time.monotonic() - start < config.http_request_timeout_ms / 1000 + 1
    burst_monitored.scrape()
