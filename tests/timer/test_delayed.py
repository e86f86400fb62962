"""Delayed and timed messages against a live engine: stored at once, visible only at their time."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from engine.client import EngineError, StoreClient
from engine.errors import ErrorCode
from supervisor.launcher import EngineProcess
from tests.helpers import wait_dispatched
from tests.timer.conftest import TOPIC

pytestmark = pytest.mark.timeout(60)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def wait_messages(client: StoreClient, queue_id: int, count: int, *, offset: int = 0,
                  deadline_s: float = 20.0) -> list[dict[str, Any]]:
    """Long-poll the queue until ``count`` messages are there (the pull wakes on each delivery)."""
    found: list[dict[str, Any]] = []
    end = time.monotonic() + deadline_s
    while len(found) < count:
        assert time.monotonic() < end, f"{len(found)} of {count} messages arrived"
        reply = client.pull(TOPIC, queue_id, offset + len(found), max_wait_ms=1_000, max_messages=256)
        found.extend(reply["messages"])
    return found


def test_a_delayed_message_reaches_its_queue_at_its_time_and_not_before(timed_engine: EngineProcess) -> None:
    with timed_engine.client() as client:
        sent_ms = wall_ms()
        result = client.send(TOPIC, [{"body": b"later", "tags": "T", "keys": ["k-1"],
                                      "properties": {"app": "x"}}], queue_id=1, delay_ms=1_200)[0]
        assert result["status"] == "PUT_OK"
        wait_dispatched(client)
        assert client.pull(TOPIC, 1, 0)["messages"] == []  # stored, not visible
        assert client.status()["offsets"]["timers_pending"] >= 0
        [message] = wait_messages(client, 1, 1)
        assert message["store_timestamp"] >= sent_ms + 1_200
        assert message["store_timestamp"] - (sent_ms + 1_200) < 1_000
        assert bytes(message["body"]) == b"later"
        assert (message["tags"], message["keys"], message["properties"]["app"]) == ("T", ["k-1"], "x")
        assert "REAL_TOPIC" not in message["properties"] and "TIMER_OUT_MS" not in message["properties"]
        # the id the producer got stays the message's id: found by it and by its key once delivered
        assert client.get_by_id(message["msg_id"])["uniq_key"] == message["uniq_key"]
        assert [m["uniq_key"] for m in client.query_by_key(TOPIC, "k-1")] == [message["uniq_key"]]


def test_timers_are_delivered_in_the_order_of_their_times(timed_engine: EngineProcess) -> None:
    with timed_engine.client() as client:
        now = wall_ms()
        delays = [1_900, 300, 1_100, 700, 1_500, 0]
        for n, delay in enumerate(delays):
            client.send(TOPIC, [{"body": b"%d" % n}], queue_id=0, deliver_at_ms=now + delay)
        messages = wait_messages(client, 0, len(delays))
        bodies = [int(bytes(m["body"])) for m in messages]
        assert bodies == sorted(range(len(delays)), key=lambda n: delays[n])
        for message in messages:
            assert message["store_timestamp"] >= now + delays[int(bytes(message["body"]))]


def test_a_delay_level_waits_its_level_and_keeps_it(timed_engine: EngineProcess) -> None:
    with timed_engine.client() as client:
        sent_ms = wall_ms()
        client.send(TOPIC, [{"body": b"level-1"}], queue_id=0, delay_level=1)  # RocketMQ's 1 s
        [message] = wait_messages(client, 0, 1)
        assert message["store_timestamp"] >= sent_ms + 1_000
        assert message["properties"]["DELAY"] == "1"


def test_pop_consumers_and_sharding_keys_get_delayed_messages_too(timed_engine: EngineProcess) -> None:
    with timed_engine.client() as client:
        results = client.send(TOPIC, [{"body": b"a"}, {"body": b"b"}], sharding_key="order-7", delay_ms=400)
        assert len(results) == 2
        popped: list[dict[str, Any]] = []
        end = time.monotonic() + 20
        while len(popped) < 2 and time.monotonic() < end:
            popped += client.pop("pop-g", TOPIC, max_wait_ms=1_000)
        assert sorted(bytes(m["body"]) for m in popped) == [b"a", b"b"]
        assert len({m["queue_id"] for m in popped}) == 1  # the key's queue, chosen when sent
        assert client.ack("pop-g", popped) == []


def test_a_deliver_time_already_past_is_stored_for_consumers_at_once(timed_engine: EngineProcess) -> None:
    with timed_engine.client() as client:
        result = client.send(TOPIC, [{"body": b"now"}], queue_id=1, deliver_at_ms=wall_ms() - 10_000)[0]
        assert (result["queue_id"], result["queue_offset"]) == (1, 0)
        assert bytes(client.pull(TOPIC, 1, 0, max_wait_ms=5_000)["messages"][0]["body"]) == b"now"


@pytest.mark.parametrize(("fields", "code"), [
    ({"delay_ms": 4 * 86_400_000}, ErrorCode.DELAY_ILLEGAL),
    ({"deliver_at_ms": 2 ** 62}, ErrorCode.DELAY_ILLEGAL),
    ({"delay_ms": 10, "delay_level": 2}, ErrorCode.INVALID_FIELD),
    ({"delay_level": 0}, ErrorCode.INVALID_FIELD),
    ({"delay_ms": -1}, ErrorCode.INVALID_FIELD),
    ({"delay_ms": 1_000, "transaction": True, "producer_group": "pg"}, ErrorCode.INVALID_FIELD),
])
def test_refused_timing_fields_get_a_clear_error_and_store_nothing(timed_engine: EngineProcess,
                                                                   fields: dict[str, Any], code: ErrorCode) -> None:
    with timed_engine.client() as client:
        with pytest.raises(EngineError) as refused:
            client.request("send", topic=TOPIC, queue_id=0, messages=[{"body": b"x"}], **fields)
        assert refused.value.code == code
        assert client.status()["offsets"]["written_offset"] == 0


def test_the_routing_properties_and_the_system_topics_are_the_engines_own(timed_engine: EngineProcess) -> None:
    with timed_engine.client() as client:
        with pytest.raises(EngineError) as refused:
            client.send(TOPIC, [{"body": b"x", "properties": {"REAL_TOPIC": "elsewhere"}}])
        assert refused.value.code == ErrorCode.INVALID_PROPERTY
        with pytest.raises(EngineError) as refused:
            client.send(TOPIC, [{"body": b"x", "properties": {"ORIGIN_OFFSET": "0"}}])
        assert refused.value.code == ErrorCode.INVALID_PROPERTY
        for system_topic in ("rmq_sys_wheel_timer", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC"):
            with pytest.raises(EngineError) as refused:
                client.send(system_topic, [{"body": b"x"}])
            assert refused.value.code == ErrorCode.INVALID_TOPIC
            with pytest.raises(EngineError) as refused:
                client.delete_topic(system_topic)
            assert refused.value.code == ErrorCode.INVALID_TOPIC
        assert "rmq_sys_wheel_timer" not in {t["topic"] for t in client.list_topics()}
        assert client.status()["offsets"]["written_offset"] == 0


def test_timer_log_files_go_once_every_unit_in_them_is_delivered(store_dir: Path) -> None:
    from engine.offline.check import check_store
    from engine.store.timer_files import TIMER_LOG_DIR
    from tests.helpers import engine_with_topics
    from tests.timer.conftest import timer_config

    config = timer_config(flush_mode="SYNC_FLUSH", timer_log_segment_bytes=52 * 64)  # 64 units a file
    with engine_with_topics(store_dir, config, {TOPIC: 1}) as engine, engine.client() as client:
        now = wall_ms()
        for n in range(200):
            client.send(TOPIC, [{"body": b"%d" % n}], queue_id=0, deliver_at_ms=now + 200 + n)
        client.send(TOPIC, [{"body": b"after"}], queue_id=0, deliver_at_ms=now + 2_500)  # slots before are done
        client.send(TOPIC, [{"body": b"last"}], queue_id=0, delay_ms=3_000_000)  # holds the newest file
        assert len(wait_messages(client, 0, 201)) == 201
        assert engine.stop() == 0  # the last checkpoint deletes what is delivered
    files = sorted(path.name for path in (store_dir / TIMER_LOG_DIR).iterdir())
    assert len(files) == 1, files  # 202 units made 4 files; the 3 full ones are delivered
    assert check_store(store_dir, config) == []
