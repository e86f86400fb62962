"""Consumer groups' offsets, tag subscriptions (with hash collisions) and per-key queue selection."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from engine.client import EngineError
from engine.config import StoreConfig
from engine.layout import java_string_hash
from harness.workload import wait_dispatched
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(120)


def test_committed_offsets_survive_a_clean_restart_and_read_minus_one_when_absent(store_dir: Path) -> None:
    engine = EngineProcess(store_dir)
    engine.start()
    try:
        with engine.client() as client:
            client.create_topic("orders", queue_count=2)
            assert client.fetch_offset("billing", "orders", 0) == -1
            client.commit_offset("billing", "orders", 0, 42)
            client.commit_offset("billing", "orders", 1, 7)
            client.commit_offset("audit", "orders", 0, 3)
            assert client.fetch_offset("billing", "orders", 0) == 42
            with pytest.raises(EngineError) as info:
                client.commit_offset("bad group!", "orders", 0, 1)
            assert info.value.name == "INVALID_FIELD"
            with pytest.raises(EngineError) as info:
                client.commit_offset("billing", "orders", 5, 1)
            assert info.value.name == "QUEUE_NOT_FOUND"
    finally:
        assert engine.stop() == 0
    stored = json.loads((store_dir / "config" / "consumerOffset.json").read_text())
    assert stored == {"offsetTable": {"orders@audit": {"0": 3}, "orders@billing": {"0": 42, "1": 7}}}
    engine.start()
    try:
        with engine.client() as client:
            assert client.fetch_offset("billing", "orders", 0) == 42
            assert client.fetch_offset("billing", "orders", 1) == 7
    finally:
        assert engine.stop() == 0


def test_after_a_crash_a_group_resumes_at_or_before_what_it_committed(store_dir: Path) -> None:
    config = StoreConfig.test_min().replace(consumer_offset_persist_interval_ms=100)
    engine = EngineProcess(store_dir, config=config)
    engine.start()
    try:
        with engine.client() as client:
            client.create_topic("t", queue_count=1)
            path = store_dir / "config" / "consumerOffset.json"
            for committed in (199, 300):  # two persists: the second keeps the first as .bak
                for offset in range(committed - 50, committed + 1):
                    client.commit_offset("g", "t", 0, offset)
                wait_persisted(path, committed)
            client.commit_offset("g", "t", 0, 500)  # committed, maybe not persisted before the crash
    finally:
        engine.kill()
    (store_dir / "config" / "consumerOffset.json").write_bytes(b"")  # a torn write: the .bak must serve
    engine.start()
    try:
        with engine.client() as client:
            resumed = client.fetch_offset("g", "t", 0)
            assert 199 <= resumed <= 500, resumed  # from the .bak copy: never ahead of a commit
    finally:
        assert engine.stop() == 0


def wait_persisted(path: Path, offset: int, timeout_s: float = 10.0) -> None:
    """Wait until the front's periodic persist wrote ``offset`` (deadline, no sleep)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if json.loads(path.read_text())["offsetTable"]["t@g"]["0"] >= offset:
                return
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            pass  # not written yet, or caught mid-rename
    raise AssertionError(f"offset {offset} was not persisted within {timeout_s} s")


def test_tag_subscriptions_filter_and_hash_collisions_never_deliver_a_wrong_tag(engine: EngineProcess) -> None:
    assert java_string_hash("Aa") == java_string_hash("BB")  # the same ConsumeQueue tags code
    with engine.client() as client:
        client.create_topic("tags", queue_count=1)
        tags = ["Aa", "BB", "red", "Aa", "blue", "BB", None]
        client.send("tags", [{"body": b"m%d" % i, **({"tags": t} if t else {})} for i, t in enumerate(tags)],
                    queue_id=0)
        wait_dispatched(client)
        only_aa = client.pull("tags", 0, 0, max_messages=32, subscription="Aa")
        assert [m["tags"] for m in only_aa["messages"]] == ["Aa", "Aa"]
        assert only_aa["next_offset"] == 7
        two = client.pull("tags", 0, 0, max_messages=32, subscription="red || blue")
        assert [m["tags"] for m in two["messages"]] == ["red", "blue"]
        everything = client.pull("tags", 0, 0, max_messages=32, subscription="*")
        assert len(everything["messages"]) == 7
        none = client.pull("tags", 0, 0, max_messages=32, subscription="green")
        assert (none["status"], none["next_offset"]) == ("NO_MATCHED_MESSAGE", 7)


def test_a_long_poll_with_a_subscription_waits_for_a_matching_message(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("lp-tags", queue_count=1)
        replies: list[dict] = []

        def consume() -> None:
            with engine.client() as consumer:
                replies.append(consumer.pull("lp-tags", 0, 0, max_wait_ms=20_000, subscription="wanted"))

        waiter = threading.Thread(target=consume)
        waiter.start()
        client.send("lp-tags", [{"body": b"not this", "tags": "other"}], queue_id=0)
        client.send("lp-tags", [{"body": b"this", "tags": "wanted"}], queue_id=0)
        waiter.join(20)
    assert replies and replies[0]["status"] == "FOUND"
    assert [m["body"] for m in replies[0]["messages"]] == [b"this"]


def test_a_sharding_key_keeps_one_key_in_one_queue(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("shard", queue_count=8)
        by_key: dict[str, set[int]] = {}
        for i in range(60):
            key = f"customer-{i % 6}"
            [result] = client.send("shard", [{"body": b"x"}], sharding_key=key)
            by_key.setdefault(key, set()).add(result["queue_id"])
        assert all(len(queues) == 1 for queues in by_key.values()), by_key
        assert len({q for queues in by_key.values() for q in queues}) > 1
        for key, (queue,) in by_key.items():
            assert queue == abs(java_string_hash(key)) % 8


def test_queue_stats_time_queries_get_by_offset_and_lag(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("timed", queue_count=2)
        empty = client.queue_stats("timed", 1)
        assert (empty["max_offset"], empty["message_count"], empty["latest_store_timestamp"]) == (0, 0, -1)
        results = []
        for i in range(20):  # store times only grow; sends in separate requests spread them a little
            results += client.send("timed", [{"body": b"t%d" % i}], queue_id=0)
        wait_dispatched(client)
        stats = client.queue_stats("timed", 0)
        assert (stats["min_offset"], stats["max_offset"], stats["message_count"]) == (0, 20, 20)
        assert stats["earliest_store_timestamp"] == results[0]["store_timestamp"]
        assert stats["latest_store_timestamp"] == results[-1]["store_timestamp"]
        times = [r["store_timestamp"] for r in results]
        for i in (0, 7, 19):
            lower = client.offset_for_time("timed", 0, times[i], boundary="lower")
            upper = client.offset_for_time("timed", 0, times[i], boundary="upper")
            assert lower == times.index(times[i]) and times[upper] == times[i]
            assert upper == len(times) - 1 - times[::-1].index(times[i])
        assert client.offset_for_time("timed", 0, 0) == 0
        assert client.offset_for_time("timed", 0, times[-1] + 60_000) == 20
        message = client.get_by_offset(results[5]["commit_log_offset"])
        assert (message["body"], message["queue_offset"]) == (b"t5", 5)
        with pytest.raises(EngineError) as info:
            client.get_by_offset(results[5]["commit_log_offset"] + 1)
        assert info.value.name == "MESSAGE_NOT_FOUND"
        client.commit_offset("readers", "timed", 0, 15)
        assert client.consumer_lag("readers", "timed") == {0: 5, 1: 0}
