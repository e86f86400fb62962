"""Topic deletion: queues and offsets go, the log keeps the bytes, a topic of the same name starts afresh.

Checked live, after a clean restart, after a SIGKILL of the whole engine right
after the deletion, and with ``check_store`` over the files each time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from engine.client import EngineError, StoreClient
from engine.config import StoreConfig
from engine.ipc.protocol import encode_request
from engine.offline.check import check_store
from engine.store.consume_queue import CONSUME_QUEUE_DIR
from engine.store.deleted_topics import DELETED_TOPICS_FILE
from harness.faults import pause_actor
from harness.workload import wait_dispatched
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(120)


def error_name(call) -> str:
    with pytest.raises(EngineError) as info:
        call()
    return info.value.name


def fill(client: StoreClient, topic: str, count: int, *, key_prefix: str) -> list[dict]:
    results = []
    for i in range(count):
        results += client.send(topic, [{"body": f"{key_prefix}-{i}".encode(), "keys": [f"{key_prefix}-{i}"]}],
                               queue_id=i % 2)
    return results


def pull_all(client: StoreClient, topic: str, queue_id: int) -> list[dict]:
    messages, offset = [], 0
    while True:
        reply = client.pull(topic, queue_id, offset, max_messages=64)
        if reply["status"] != "FOUND":
            return messages
        messages += reply["messages"]
        offset = reply["next_offset"]


def test_delete_topic_drops_queues_and_offsets_and_a_new_topic_of_that_name_starts_at_zero(store_dir: Path) -> None:
    engine = EngineProcess(store_dir, config=StoreConfig.test_min())
    engine.start()
    try:
        with engine.client() as client:
            client.create_topic("orders", queue_count=2)
            client.create_topic("keep", queue_count=1)
            old = fill(client, "orders", 40, key_prefix="old")
            client.send("keep", [{"body": b"stays", "keys": ["k"]}])
            client.commit_offset("billing", "orders", 0, 5)
            client.commit_offset("billing", "keep", 0, 1)
            wait_dispatched(client)
            assert (store_dir / CONSUME_QUEUE_DIR / "orders").is_dir()

            deleted = client.delete_topic("orders")
            assert deleted["topic"] == "orders"
            assert deleted["deletion_offset"] > old[-1]["commit_log_offset"]
            assert [t["topic"] for t in client.list_topics()] == ["keep"]
            assert error_name(lambda: client.pull("orders", 0, 0)) == "TOPIC_NOT_FOUND"
            assert error_name(lambda: client.fetch_offset("billing", "orders", 0)) == "TOPIC_NOT_FOUND"
            assert error_name(lambda: client.query_by_key("orders", "old-1")) == "TOPIC_NOT_FOUND"
            assert error_name(lambda: client.delete_topic("orders")) == "TOPIC_NOT_FOUND"
            # Every owner follows the deletion before it applies the next dispatch.
            client.send("keep", [{"body": b"after"}])
            wait_dispatched(client)
            assert not (store_dir / CONSUME_QUEUE_DIR / "orders").exists()
            offsets = json.loads((store_dir / "config" / "consumerOffset.json").read_text())["offsetTable"]
            assert offsets == {"keep@billing": {"0": 1}}
            # The log keeps the bytes until retention: the old record is still there by its offset.
            assert client.get_by_offset(old[0]["commit_log_offset"])["body"] == b"old-0"

            client.create_topic("orders", queue_count=1)
            fresh = client.send("orders", [{"body": b"new-0", "keys": ["new-0"]}, {"body": b"new-1"}])
            assert [r["queue_offset"] for r in fresh] == [0, 1]
            wait_dispatched(client)
            assert [m["body"] for m in pull_all(client, "orders", 0)] == [b"new-0", b"new-1"]
            assert client.query_by_key("orders", "old-1") == []
            assert [m["body"] for m in client.query_by_key("orders", "new-0")] == [b"new-0"]
            assert client.fetch_offset("billing", "orders", 0) == -1
            assert [m["body"] for m in pull_all(client, "keep", 0)] == [b"stays", b"after"]
    finally:
        assert engine.stop() == 0
    assert check_store(store_dir, StoreConfig.test_min()) == []

    engine.start()
    try:
        with engine.client() as client:
            assert [m["body"] for m in pull_all(client, "orders", 0)] == [b"new-0", b"new-1"]
            assert client.send("orders", [{"body": b"new-2"}])[0]["queue_offset"] == 2
            assert client.query_by_key("orders", "old-3") == []
    finally:
        assert engine.stop() == 0


def test_a_deletion_survives_a_sigkill_of_the_whole_engine(store_dir: Path) -> None:
    config = StoreConfig.test_min()
    engine = EngineProcess(store_dir, config=config)
    engine.start()
    try:
        with engine.client() as client:
            client.create_topic("gone", queue_count=2)
            fill(client, "gone", 30, key_prefix="g")
            wait_dispatched(client)
            client.delete_topic("gone")
            table = json.loads((store_dir / DELETED_TOPICS_FILE).read_text())["deletedTopicTable"]
            assert set(table) == {"gone"}  # on disk before the answer
    finally:
        engine.kill()  # the owners may not have removed the queues yet; recovery must
    engine.start()
    try:
        with engine.client() as client:
            assert "gone" not in [t["topic"] for t in client.list_topics()]
            client.create_topic("gone", queue_count=2)
            assert client.send("gone", [{"body": b"again"}], queue_id=1)[0]["queue_offset"] == 0
            wait_dispatched(client)
            assert pull_all(client, "gone", 0) == []
            assert [m["body"] for m in pull_all(client, "gone", 1)] == [b"again"]
    finally:
        assert engine.stop() == 0
    assert check_store(store_dir, config) == []


def test_deleting_needs_an_existing_valid_topic(engine: EngineProcess) -> None:
    with engine.client() as client:
        assert error_name(lambda: client.delete_topic("never-made")) == "TOPIC_NOT_FOUND"
        assert error_name(lambda: client.delete_topic("bad name!")) == "INVALID_TOPIC"
        assert error_name(lambda: client.request("delete_topic")) == "INVALID_FIELD"
        assert error_name(lambda: client.request("delete_topic", topic=7)) == "INVALID_FIELD"
        client.create_topic("t", queue_count=1)
        assert client.delete_topic("t")["topic"] == "t"
        assert client.ping()


def test_a_deletion_lost_with_a_killed_writer_is_sent_again_to_the_restarted_one(engine: EngineProcess,
                                                                                   store_dir: Path) -> None:
    """The writer dies with a deletion in its socket: the front sends it again once a new writer
    connects, the client gets its answer, and the topic is not left "being deleted"."""
    with engine.client() as client, engine.client(timeout_ms=30_000) as deleter:
        client.create_topic("doomed", queue_count=2)
        fill(client, "doomed", 10, key_prefix="d")
        wait_dispatched(client)
        _name, writer = pause_actor(store_dir, "writer")
        try:
            deleter.send_raw(encode_request("delete_topic", 1, topic="doomed"))
            deadline = time.monotonic() + 10
            while "doomed" in [t["topic"] for t in client.list_topics()]:  # hidden once forwarded
                assert time.monotonic() < deadline, "the front did not take the deletion"
        finally:
            writer.kill()  # while stopped: what it had not read is lost with it
        reply = deleter.receive_raw()  # from the writer the supervisor started again
        assert reply["ok"] and reply["topic"] == "doomed", reply
        client.create_topic("doomed", queue_count=2)
        assert client.send("doomed", [{"body": b"after"}], queue_id=0)[0]["queue_offset"] == 0
        wait_dispatched(client)
        assert [m["body"] for m in pull_all(client, "doomed", 0)] == [b"after"]
        assert pull_all(client, "doomed", 1) == []


def test_a_record_and_a_receipt_handle_of_a_deleted_life_of_a_topic_are_told_apart(engine: EngineProcess) -> None:
    """After delete and create again, the new topic's queues start at 0 again: get_by_id marks the old
    record as a deleted life's, and a receipt handle from the old life acks nothing of the new one."""
    with engine.client() as client:
        client.create_topic("d14", queue_count=1)
        [old] = client.send("d14", [{"body": b"old-record"}], queue_id=0)
        wait_dispatched(client)
        [popped] = client.pop("g14", "d14", queue_id=0)
        assert client.ack("g14", [popped]) == []
        client.delete_topic("d14")
        client.create_topic("d14", queue_count=1)
        [new] = client.send("d14", [{"body": b"new-record"}] + [{"body": b"more"}] * 9, queue_id=0)[:1]
        wait_dispatched(client)

        old_reply = client.request("get_by_id", msg_id=old["msg_id"])
        new_reply = client.request("get_by_id", msg_id=new["msg_id"])
        assert (old_reply["message"]["body"], old_reply["message"]["queue_offset"]) == (b"old-record", 0)
        assert old_reply.get("deleted_topic") is True
        assert (new_reply["message"]["body"], new_reply.get("deleted_topic")) == (b"new-record", None)

        [fresh] = client.pop("g14", "d14", queue_id=0, max_messages=1)
        assert fresh["body"] == b"new-record" and fresh["receipt_handle"] != popped["receipt_handle"]
        [refused] = client.ack("g14", [popped])  # the old life's handle: not the new message's
        assert refused["error"]["name"] == "INVALID_RECEIPT_HANDLE"
        assert client.pop_stats("g14", "d14", 0)["in_flight"] == 1
        assert client.ack("g14", [fresh]) == []
