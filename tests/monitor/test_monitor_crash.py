"""The monitor is supervised like every actor: killed, it comes back and serves again, and the
restarts of the others show in its figures."""

from __future__ import annotations

import pytest

from engine.ipc.control import EventStream
from harness.faults import kill_actor
from tests.helpers import wait_dispatched
from tests.monitor.conftest import Monitored, value

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("role", ["monitor", "front"])
def test_a_killed_actor_restarts_and_the_metrics_say_so(monitored: Monitored, role: str) -> None:
    store_dir = monitored.engine.store_dir
    with monitored.engine.client() as client:
        client.send("before", [{"body": b"a"}] * 5)
    monitored.wait_scrape(lambda s: value(s, "rmqpy_queue_max_offset", topic="before", queue_id="0") +
                          value(s, "rmqpy_queue_max_offset", topic="before", queue_id="1") +
                          value(s, "rmqpy_queue_max_offset", topic="before", queue_id="2") +
                          value(s, "rmqpy_queue_max_offset", topic="before", queue_id="3") == 5)
    events = EventStream(store_dir)
    try:
        name, pid = kill_actor(store_dir, role)
        exited = events.wait_for("actor.exited", name=name)
        assert exited.exit_code == -9 and exited.pid == pid
        events.wait_for("actor.running", name=name)
    finally:
        events.close()
    samples = monitored.wait_scrape(lambda s: value(s, "rmqpy_actor_restarts_total", actor=name) == 1 and
                                    value(s, "rmqpy_actor_up", actor=name) == 1)
    assert all(value(samples, "rmqpy_actor_up", actor=a) == 1 for a in monitored.engine.actor_pids())
    # the store did not notice: what was sent is there, and sends go on
    with monitored.engine.client() as client:
        client.send("before", [{"body": b"b"}] * 5)
        wait_dispatched(client)  # a send is answered before its queue units are written
        assert sum(client.queue_stats("before", q)["max_offset"] for q in range(4)) == 10
    status, overview = monitored.api("/api/overview")
    assert status == 200 and overview["state"] == "RUNNING"


def test_dashboard_requests_with_bad_input_get_clear_errors(monitored: Monitored) -> None:
    status, body = monitored.api("/api/search?msg_id=zz")
    assert status == 400 and body["error"]["name"] == "INVALID_MSG_ID"
    status, body = monitored.api("/api/search?topic=nowhere&time_ms=0")
    assert status == 400 and "no topic" in body["error"]["message"]
    status, body = monitored.api("/api/search?topic=t&time_ms=yesterday")
    assert status == 400 and body["error"]["name"] == "BAD_REQUEST"
    status, body = monitored.api("/api/nothing")
    assert status == 404
    status, body = monitored.api("/api/search?topic=bad%20topic&key=k")
    assert status == 400 and body["error"]["name"] == "INVALID_TOPIC"
    # and the monitor is still there
    status, overview = monitored.api("/api/overview")
    assert status == 200 and overview["state"] == "RUNNING"
