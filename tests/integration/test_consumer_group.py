"""Consumer groups whose members share a topic's queues: member processes (harness/group_member.py)
that join, read, die and are added, against a real engine.

The engine's ``consumer_session_timeout_ms`` is 1.5 s here, so a dead member's queues must move
within 1⅓ of it (2 s) plus the time the others take to see it (a poll); the test allows 6 s.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.config import StoreConfig
from engine.errors import ErrorCode
from engine.store.sharing_groups import SHARING_GROUPS_FILE
from harness.faults import kill_actor
from harness.group_member import MemberProcesses
from rmqpy import EngineError, Producer, PullConsumer
from supervisor.launcher import EngineProcess
from tests.helpers import engine_with_topics

SESSION_MS = 1_500
QUEUES = 8


def until(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Wait for ``condition``; the seconds it took."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(0.02)
    return time.monotonic() - start


@pytest.fixture
def engine(store_dir: Path) -> Iterator[EngineProcess]:
    config = StoreConfig.test_min().replace(consumer_session_timeout_ms=SESSION_MS)
    with engine_with_topics(store_dir, config, {"shared": QUEUES}) as process:
        yield process


@pytest.fixture
def members(engine: EngineProcess, tmp_path: Path) -> Iterator[MemberProcesses]:
    group = MemberProcesses(engine.endpoint, "g", "shared", QUEUES, tmp_path)
    try:
        yield group
    finally:
        group.stop_all()


def produce(engine: EngineProcess, prefix: str, count: int) -> set[str]:
    bodies = {f"{prefix}-{i}" for i in range(count)}
    with Producer(endpoint=engine.endpoint) as producer:
        for body in sorted(bodies):
            producer.send("shared", body.encode())
    return bodies


@pytest.mark.timeout(120)
def test_members_share_the_queues_and_take_up_a_dead_members_own(engine: EngineProcess,
                                                                  members: MemberProcesses) -> None:
    for name in ("m0", "m1", "m2"):
        members.start(name)
    until(members.balanced, 20, "three members sharing the 8 queues")
    assert sorted(len(q or []) for q in members.queues().values()) == [2, 3, 3]  # average allocation

    first = produce(engine, "a", 400)
    until(lambda: first <= set(members.bodies()), 20, "the group reading the first 400")
    counts = members.bodies()
    assert max(counts.values()) == 1, "while all members stay, each message is read once"

    dead_queues = members.queues()["m0"]
    members.kill("m0")
    moved_in = until(members.balanced, 6, "the dead member's queues taken up by the others")
    assert not set(dead_queues or []) - {q for qs in members.queues().values() for q in qs or []}
    second = produce(engine, "b", 400)
    until(lambda: second <= set(members.bodies(["m1", "m2"])), 20, "the others reading the next 400")

    members.start("m3")
    until(members.balanced, 20, "a fourth member getting its share")
    third = produce(engine, "c", 400)
    until(lambda: third <= set(members.bodies()), 20, "the four reading the last 400")
    assert set(members.bodies(["m3"])) & third, "the new member reads its queues"
    everything = members.bodies()
    assert first | second | third <= set(everything), "nothing lost"
    assert all(everything[body] == 1 for body in third), "while the four stay, each message is read once"
    # A queue changes hands only once let go or its member dead: the messages read twice are those
    # the killed member had read and not committed (at most one poll's, 32).
    assert sum(count - 1 for count in everything.values()) <= 32
    print(f"a dead member's queues moved in {moved_in:.2f} s")


@pytest.mark.timeout(120)
def test_members_keep_their_queues_over_a_front_killed_and_restarted(engine: EngineProcess,
                                                                     members: MemberProcesses) -> None:
    """The restarted front knows no member: the group is on disk, so for one session it grants each
    member only what it says it reads, and a member that joins then waits."""
    for name in ("m0", "m1"):
        members.start(name)
    until(members.balanced, 20, "two members sharing the queues")
    before = members.queues()
    kill_actor(engine.store_dir, "front")
    members.start("m2")
    first = produce(engine, "r", 300)  # goes through once the supervisor has the front back
    until(lambda: first <= set(members.bodies()), 30, "the group reading through the front's restart")
    assert max(members.bodies().values()) == 1, "no queue was read by two members"
    until(members.balanced, 20, "the three sharing the queues once the front has settled")
    assert before != members.queues()


@pytest.mark.timeout(60)
def test_heartbeat_names_the_members_and_a_leaving_one_goes_at_once(engine: EngineProcess) -> None:
    with engine.client() as client:
        first = client.request("heartbeat", group="g", topic="shared", client_id="b")
        assert first["members"] == ["b"] and first["queue_count"] == QUEUES
        assert first["session_timeout_ms"] == SESSION_MS and first["settled"] is True  # a group new to this engine
        shared = json.loads((engine.store_dir / SHARING_GROUPS_FILE).read_text())["groups"]
        assert ["g", "shared"] in shared, "on disk before its first grant, not at the next persist interval"
        assert client.request("heartbeat", group="g", topic="shared", client_id="a")["members"] == ["a", "b"]
        other_group = client.request("heartbeat", group="h", topic="shared", client_id="c")
        assert other_group["members"] == ["c"]
        assert client.request("heartbeat", group="g", topic="shared", client_id="a", leaving=True)["members"] == ["b"]

        def refused(**fields: Any) -> ErrorCode:
            with pytest.raises(EngineError) as caught:
                client.request("heartbeat", **fields)
            return ErrorCode(caught.value.code)

        assert refused(group="g", topic="missing", client_id="a") == ErrorCode.TOPIC_NOT_FOUND
        assert refused(group="bad group", topic="shared", client_id="a") == ErrorCode.INVALID_FIELD
        assert refused(group="g", topic="shared", client_id="") == ErrorCode.INVALID_FIELD
        assert refused(group="g", topic="shared") == ErrorCode.INVALID_FIELD
        client.request("pop", group="popping", topic="shared", max_messages=1)
        assert refused(group="popping", topic="shared", client_id="a") == ErrorCode.GROUP_MODE_CONFLICT
        assert client.request("ping")["pong"], "the front took every bad heartbeat in its stride"


@pytest.mark.timeout(60)
def test_members_in_one_process_hand_queues_over_with_their_offsets(engine: EngineProcess) -> None:
    bodies = produce(engine, "x", 80)
    read: list[str] = []

    def read_while(consumers: list[PullConsumer], condition: Callable[[], bool], what: str) -> None:
        def step() -> bool:
            for consumer in consumers:
                read.extend(m.body.decode() for m in consumer.poll(50))
            return condition()
        until(step, 10, what)

    with PullConsumer("g", "shared", endpoint=engine.endpoint, commit_every=1, batch_size=4) as first:
        # A front that just started grants, for one session, only queues a member already reads.
        read_while([first], lambda: first.queue_ids == list(range(QUEUES)), "alone, a member reads every queue")
        with PullConsumer("g", "shared", endpoint=engine.endpoint, commit_every=1, batch_size=4) as second:
            assert second.queue_ids == [], "a new member's share is granted once the first lets it go"
            read_while([first, second], lambda: len(second.queue_ids) == QUEUES // 2, "the hand-over of half")
            assert sorted(first.queue_ids + second.queue_ids) == list(range(QUEUES))
            read_while([first, second], lambda: bodies <= set(read), "the two reading everything")
        read_while([first], lambda: first.queue_ids == list(range(QUEUES)), "the first taking every queue back")
    assert len(read) == len(set(read)), "a queue changes hands once let go and committed: nothing read twice"
    with engine.client() as client:
        for queue_id in range(QUEUES):
            end = client.queue_stats("shared", queue_id)["max_offset"]
            assert client.fetch_offset("g", "shared", queue_id) == end, "every queue committed to its end"
