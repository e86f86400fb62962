"""Floods of admin requests: every one answered, no actor misses its heartbeat, tables on disk.

Each create, commit and delete used to be handled whole inside the front's loop, with a
full rewrite and fsync of the table it changed: 10,000 pipelined creates kept the front
from its heartbeat for seconds and the supervisor killed it. Tables are group-committed
now (one write per batch of requests); these floods check that with the supervisor
watching.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq

from engine.client import EngineError
from engine.config import StoreConfig
from engine.ipc.control import control
from engine.ipc.messages import StatusQuery
from engine.ipc.protocol import encode_request
from engine.store.consumer_offsets import OFFSETS_FILE
from engine.store.deleted_topics import DELETED_TOPICS_FILE
from engine.store.topics import TOPICS_FILE
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(240)

FLOOD = 10_000
RATE_MIN_PER_S = 1_000  # before the group commit: about 22 creates/s, and the front was killed


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    process = EngineProcess(tmp_path_factory.mktemp("floods") / "store", config=StoreConfig.test_min())
    process.start()
    try:
        yield process
    finally:
        process.stop()


def pipeline(endpoint: str, frames: list[bytes], *, in_flight_max: int, timeout_s: float = 120.0
             ) -> tuple[list[dict[str, Any]], float]:
    """Send every frame with up to ``in_flight_max`` unanswered; (replies in id order, seconds taken)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(endpoint)
    replies: dict[int, dict[str, Any]] = {}
    started = time.monotonic()
    deadline = started + timeout_s
    sent = 0
    try:
        while len(replies) < len(frames):
            while sent < len(frames) and sent - len(replies) < in_flight_max:
                sock.send(frames[sent])
                sent += 1
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            assert remaining_ms > 0 and sock.poll(remaining_ms), \
                f"{len(frames) - len(replies)} of {len(frames)} requests unanswered"
            while sock.poll(0):
                reply = msgspec.msgpack.decode(sock.recv())
                replies[reply["id"]] = reply
    finally:
        sock.close()
    return [replies[i] for i in range(len(frames))], time.monotonic() - started


def assert_all_ok(replies: list[dict[str, Any]]) -> None:
    refused = Counter(r["error"]["name"] for r in replies if not r["ok"])
    assert not refused, f"refused: {dict(refused)}"


def assert_no_restarts(engine: EngineProcess) -> None:
    status = control(engine.store_dir, StatusQuery())
    assert [(a.name, a.restarts) for a in status.actors if a.restarts] == []
    assert all(a.lifecycle == "RUNNING" for a in status.actors), [(a.name, a.lifecycle) for a in status.actors]


def test_ten_thousand_pipelined_creates_are_answered_and_saved(engine: EngineProcess) -> None:
    frames = [encode_request("create_topic", i, topic=f"flood-{i}", queue_count=2) for i in range(FLOOD)]
    replies, seconds = pipeline(engine.endpoint, frames, in_flight_max=FLOOD)
    assert_all_ok(replies)
    assert_no_restarts(engine)
    assert FLOOD / seconds >= RATE_MIN_PER_S, f"{FLOOD / seconds:.0f} creates/s"
    # Answered means on disk: the table holds every topic now.
    table = json.loads((engine.store_dir / TOPICS_FILE).read_text())["topicConfigTable"]
    assert {f"flood-{i}" for i in range(FLOOD)} <= set(table)


def test_ten_thousand_pipelined_offset_commits_are_answered(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("commits", queue_count=4)
    frames = [encode_request("commit_offset", i, group=f"group-{i % 500}", topic="commits", queue_id=i % 4,
                             offset=i) for i in range(FLOOD)]
    replies, seconds = pipeline(engine.endpoint, frames, in_flight_max=FLOOD)
    assert_all_ok(replies)
    assert_no_restarts(engine)
    assert FLOOD / seconds >= RATE_MIN_PER_S, f"{FLOOD / seconds:.0f} commits/s"
    with engine.client() as client:
        assert client.fetch_offset("group-499", "commits", 3) == FLOOD - 1


def test_ten_thousand_pipelined_deletions_are_answered_and_saved(engine: EngineProcess) -> None:
    frames = [encode_request("create_topic", i, topic=f"flood-{i}", queue_count=2) for i in range(FLOOD)]
    assert_all_ok(pipeline(engine.endpoint, frames, in_flight_max=FLOOD)[0])  # made here if run alone
    with engine.client() as client:
        client.commit_offset("g", "flood-1", 0, 5)
    # Deletions go through the writer's queue (writer_queue_requests_max, 256 deep; ZeroMQ frees
    # room in steps of half of it): a client that keeps more in flight gets BUSY for the rest.
    frames = [encode_request("delete_topic", i, topic=f"flood-{i}") for i in range(FLOOD)]
    replies, seconds = pipeline(engine.endpoint, frames, in_flight_max=100)
    assert_all_ok(replies)
    assert_no_restarts(engine)
    assert FLOOD / seconds >= RATE_MIN_PER_S, f"{FLOOD / seconds:.0f} deletions/s"
    table = json.loads((engine.store_dir / TOPICS_FILE).read_text())["topicConfigTable"]
    assert not [name for name in table if name.startswith("flood-")]
    deleted = json.loads((engine.store_dir / DELETED_TOPICS_FILE).read_text())["deletedTopicTable"]
    assert {f"flood-{i}" for i in range(FLOOD)} <= set(deleted)
    offsets = json.loads((engine.store_dir / OFFSETS_FILE).read_text())["offsetTable"]
    assert "flood-1@g" not in offsets  # a deletion's dropped offsets are saved with the table
    with engine.client() as client:
        assert [t for t in client.list_topics() if t["topic"].startswith("flood-")] == []


def owners_parked(engine: EngineProcess) -> int:
    return sum(a.detail.get("parked_pulls", 0) for a in control(engine.store_dir, StatusQuery()).actors)


def test_thousands_of_parked_pulls_woken_at_once_are_served_in_slices(tmp_path) -> None:
    """One send wakes every pull parked on its queue; an owner serves them a slice per loop
    turn (long_poll_wakes_per_turn_max), heartbeating between slices, and every one is answered.
    (The front's queue to an owner holds socket_hwm_messages requests: a client that pipelines
    far more than that before the owner parks them gets SERVICE_NOT_AVAILABLE for the rest.)"""
    parked = 15_000
    config = StoreConfig.test_min().replace(heartbeat_timeout_ms=1_000, long_poll_wait_ms_max=60_000)
    engine = EngineProcess(tmp_path / "store", config=config)
    engine.start()
    try:
        with engine.client() as client:
            client.create_topic("parked", queue_count=1)
        frames = [encode_request("pull", i, topic="parked", queue_id=0, offset=0, max_wait_ms=60_000)
                  for i in range(parked)]
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect(engine.endpoint)
        try:
            for frame in frames:
                sock.send(frame)
            deadline = time.monotonic() + 60
            while owners_parked(engine) < parked:
                assert time.monotonic() < deadline, f"only {owners_parked(engine)} pulls parked"
                time.sleep(0.05)  # polling the supervisor's status, with a deadline
            with engine.client() as client:
                client.send("parked", [{"body": b"wake"}], queue_id=0)
            statuses = Counter()
            deadline = time.monotonic() + 60
            while sum(statuses.values()) < parked:
                remaining_ms = int((deadline - time.monotonic()) * 1000)
                assert remaining_ms > 0 and sock.poll(remaining_ms), f"answered: {dict(statuses)}"
                reply = msgspec.msgpack.decode(sock.recv())
                statuses[reply.get("status") or reply["error"]["name"]] += 1
        finally:
            sock.close()
        assert statuses == {"FOUND": parked}
        assert_no_restarts(engine)
    finally:
        engine.stop()


def test_topic_and_group_counts_are_bounded_with_a_clear_error(tmp_path) -> None:
    config = StoreConfig.test_min().replace(topic_count_max=3, consumer_offset_entries_max=2)
    engine = EngineProcess(tmp_path / "store", config=config)
    engine.start()
    try:
        with engine.client() as client:
            for name in ("a", "b", "c"):
                client.create_topic(name)
            for call in (lambda: client.create_topic("d"), lambda: client.send("e", [{"body": b"x"}])):
                with pytest.raises(EngineError) as info:
                    call()
                assert info.value.name == "LIMIT_EXCEEDED" and info.value.code == 21
            client.create_topic("a", queue_count=8)  # growing an existing topic is not a new one
            client.commit_offset("g1", "a", 0, 1)
            client.commit_offset("g2", "a", 0, 1)
            client.commit_offset("g1", "a", 1, 5)  # a known (group, topic): another queue is fine
            with pytest.raises(EngineError) as info:
                client.commit_offset("g3", "a", 0, 1)
            assert info.value.name == "LIMIT_EXCEEDED"
            client.delete_topic("c")
            client.create_topic("d")  # room again
        assert_no_restarts(engine)
    finally:
        engine.stop()
