"""Long polling: a pull that finds nothing waits for a message (or its deadline), costing nothing meanwhile."""

from __future__ import annotations

import threading
import time

import msgspec
import psutil
import pytest
import zmq

from supervisor.launcher import EngineProcess
from tests.helpers import parked_requests

pytestmark = pytest.mark.timeout(120)


def test_a_waiting_pull_is_answered_when_a_message_arrives(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("lp", queue_count=1)
        replies: list[dict] = []

        def consume() -> None:
            with engine.client() as consumer:
                replies.append(consumer.pull("lp", 0, 0, max_wait_ms=20_000))

        waiter = threading.Thread(target=consume)
        started = time.monotonic()
        waiter.start()
        deadline = time.monotonic() + 10
        while parked_requests(engine) < 1:  # the pull is parked at its owner
            assert time.monotonic() < deadline
        client.send("lp", [{"body": b"wake up"}], queue_id=0)
        waiter.join(20)
        assert replies and replies[0]["status"] == "FOUND"
        assert replies[0]["messages"][0]["body"] == b"wake up"
        assert time.monotonic() - started < 15, "answered by the arrival, not by the deadline"


def test_a_waiting_pull_times_out_with_no_new_message(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("idle", queue_count=1)
        started = time.monotonic()
        reply = client.pull("idle", 0, 0, max_wait_ms=300)
        waited = time.monotonic() - started
    assert reply["status"] == "NO_MESSAGE_IN_QUEUE"
    assert 0.25 <= waited < 5


def test_a_thousand_parked_pulls_cost_no_cpu_and_one_send_wakes_them(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("many", queue_count=1)
    ctx = zmq.Context.instance()
    sockets = []
    for i in range(1000):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(engine.endpoint)
        sock.send(msgspec.msgpack.encode({"v": 1, "op": "pull", "id": i, "topic": "many", "queue_id": 0,
                                          "offset": 0, "max_wait_ms": 30_000}))
        sockets.append(sock)
    try:
        deadline = time.monotonic() + 20
        while parked_requests(engine) < 1000:
            assert time.monotonic() < deadline, parked_requests(engine)
        owners = [psutil.Process(pid) for name, pid in engine.actor_pids().items() if name.startswith("owner")]
        before = sum(p.cpu_times().user + p.cpu_times().system for p in owners)
        with engine.client() as client:  # the window: one more parked pull, answered at its deadline
            client.create_topic("window", queue_count=1)
            assert client.pull("window", 0, 0, max_wait_ms=1000)["status"] == "NO_MESSAGE_IN_QUEUE"
        idle = sum(p.cpu_times().user + p.cpu_times().system for p in owners) - before
        assert idle < 0.2, f"parked pulls cost {idle:.2f} s of CPU per second"
        with engine.client() as client:
            client.send("many", [{"body": b"for everyone"}], queue_id=0)
        poller = zmq.Poller()
        for sock in sockets:
            poller.register(sock, zmq.POLLIN)
        answered = 0
        deadline = time.monotonic() + 20
        while answered < 1000 and time.monotonic() < deadline:
            for sock, _ in poller.poll(1000):
                reply = msgspec.msgpack.decode(sock.recv())
                assert reply["status"] == "FOUND" and reply["messages"][0]["body"] == b"for everyone"
                poller.unregister(sock)
                answered += 1
        assert answered == 1000
    finally:
        for sock in sockets:
            sock.close()
