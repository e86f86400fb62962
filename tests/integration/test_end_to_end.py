"""The engine end to end: real supervisor, real actor processes, real sockets and files."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from engine.config import KiB, MiB, StoreConfig
from engine.layout import decode_msg_id
from supervisor.launcher import EngineProcess
from supervisor.supervisor import LOG_DIR
from tests.helpers import wait_dispatched

pytestmark = pytest.mark.timeout(300)

TOPICS = ("orders", "payments")
QUEUES = 4


def rolling_config() -> StoreConfig:
    """1 MiB segments, so that 10,000 messages roll the log several times."""
    return StoreConfig.test_min().replace(segment_size_bytes=1 * MiB, message_body_bytes_max=512 * KiB,
                                          send_batch_bytes_max=512 * KiB)


def make_message(rng: random.Random, topic: str, n: int) -> dict[str, Any]:
    size = rng.choice((1, 17, 200, 1500))
    body = bytes(rng.getrandbits(8) for _ in range(size)) if n % 3 == 0 else (f"{topic}-{n}-" * 50).encode()[:size]
    return {"body": body, "tags": f"tag{n % 5}", "keys": [f"{topic}-key-{n}", f"group-{n % 7}"],
            "properties": {"seq": str(n), "note": "ünïcødé ✓"}, "flag": n % 4}


def send_all(engine: EngineProcess, rng: random.Random, count_per_topic: int) -> dict[tuple[str, int], list]:
    """Send messages in batches; return, per queue, (message, send result) in queue order."""
    sent: dict[tuple[str, int], list] = {(t, q): [] for t in TOPICS for q in range(QUEUES)}
    with engine.client() as client:
        for topic in TOPICS:
            client.create_topic(topic, queue_count=QUEUES)
        n = 0
        while n < count_per_topic:
            for topic in TOPICS:
                batch = [make_message(rng, topic, n + i) for i in range(50)]
                queue_id = None if (n // 50) % 2 else (n // 50) % QUEUES
                results = client.send(topic, batch, queue_id=queue_id)
                assert [r["status"] for r in results] == ["PUT_OK"] * len(batch)
                assert len({r["queue_id"] for r in results}) == 1
                for message, result in zip(batch, results, strict=True):
                    sent[(topic, result["queue_id"])].append((message, result))
            n += 50
    return sent


def pull_queue(client, topic: str, queue_id: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    offset = 0
    while True:
        reply = client.pull(topic, queue_id, offset, max_messages=97)
        if reply["status"] == "OFFSET_OVERFLOW_ONE":
            return messages
        assert reply["status"] == "FOUND", reply["status"]
        assert reply["messages"][0]["queue_offset"] == offset
        messages.extend(reply["messages"])
        offset = reply["next_offset"]


def assert_queue_intact(pulled: list[dict[str, Any]], sent: list, topic: str, queue_id: int) -> None:
    assert len(pulled) == len(sent)
    for offset, (got, (message, result)) in enumerate(zip(pulled, sent, strict=True)):
        assert got["queue_offset"] == offset == result["queue_offset"]
        assert (got["topic"], got["queue_id"]) == (topic, queue_id)
        assert got["body"] == message["body"]
        assert got["tags"] == message["tags"]
        assert got["keys"] == message["keys"]
        assert got["flag"] == message["flag"]
        for name, value in message["properties"].items():
            assert got["properties"][name] == value
        assert got["msg_id"] == result["msg_id"]
        assert got["commit_log_offset"] == result["commit_log_offset"]
        assert got["store_timestamp"] == result["store_timestamp"]
        assert decode_msg_id(got["msg_id"])[1] == got["commit_log_offset"]
        assert len(got["uniq_key"]) == 32


def test_two_topics_survive_segment_rolls_and_a_restart(store_dir: Path) -> None:
    rng = random.Random(20261122)
    engine = EngineProcess(store_dir, config=rolling_config())
    engine.start()
    try:
        sent = send_all(engine, rng, count_per_topic=5_000)
        with engine.client() as client:
            wait_dispatched(client)
        assert sum(len(v) for v in sent.values()) == 10_000
        segments = sorted((store_dir / "commitlog").iterdir())
        assert len(segments) >= 4, "the log should have rolled several times"
        assert all(len(p.name) == 20 and p.stat().st_size == 1 * MiB for p in segments)
        with engine.client() as client:
            for (topic, queue_id), expected in sent.items():
                assert_queue_intact(pull_queue(client, topic, queue_id), expected, topic, queue_id)
            message, result = sent[("payments", 2)][123]
            [found] = client.query_by_key("payments", message["keys"][0])
            assert found["msg_id"] == result["msg_id"] and found["body"] == message["body"]
            assert client.get_by_id(result["msg_id"])["body"] == message["body"]
            assert client.query_by_key("orders", message["keys"][0]) == []
    finally:
        assert engine.stop() == 0
    assert not (store_dir / "abort").exists(), "a clean stop removes the abort marker"

    engine.start()
    try:
        with engine.client() as client:
            for (topic, queue_id), expected in sent.items():
                assert_queue_intact(pull_queue(client, topic, queue_id), expected, topic, queue_id)
            before = len(sent[("orders", 1)])
            [result] = client.send("orders", [{"body": b"after restart", "keys": ["after"]}], queue_id=1)
            assert result["queue_offset"] == before
            wait_dispatched(client)
            [found] = client.query_by_key("orders", "after")
            assert found["body"] == b"after restart"
            message, old = sent[("orders", 3)][7]
            assert [m["msg_id"] for m in client.query_by_key("orders", message["keys"][0])] == [old["msg_id"]]
    finally:
        assert engine.stop() == 0


def test_pull_statuses_at_queue_edges(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("edges", queue_count=2)
        empty = client.pull("edges", 1, 0)
        assert (empty["status"], empty["next_offset"], empty["max_offset"]) == ("NO_MESSAGE_IN_QUEUE", 0, 0)
        client.send("edges", [{"body": b"m%d" % i} for i in range(3)], queue_id=0)
        wait_dispatched(client)
        found = client.pull("edges", 0, 1, max_messages=10)
        assert found["status"] == "FOUND" and [m["body"] for m in found["messages"]] == [b"m1", b"m2"]
        assert (found["next_offset"], found["min_offset"], found["max_offset"]) == (3, 0, 3)
        one = client.pull("edges", 0, 3)
        assert (one["status"], one["next_offset"]) == ("OFFSET_OVERFLOW_ONE", 3)
        badly = client.pull("edges", 0, 1000)
        assert (badly["status"], badly["next_offset"]) == ("OFFSET_OVERFLOW_BADLY", 3)


def test_the_python_codec_and_the_compiled_one_serve_the_same_store(store_dir: Path, monkeypatch) -> None:
    """RMQPY_PURE_PYTHON=1 runs every actor on engine/codec_py.py; the compiled codec then reads
    what it wrote, and both answer pulls, filtered pulls, key queries and gets identically."""
    rng = random.Random(5)
    batch = [make_message(rng, "orders", n) for n in range(60)]

    def read_back(engine: EngineProcess) -> list:
        with engine.client() as client:
            wait_dispatched(client)
            plain = pull_queue(client, "orders", 0)
            tagged = client.pull("orders", 0, 0, max_messages=100, subscription="tag1 || tag3")["messages"]
            found = client.query_by_key("orders", batch[17]["keys"][0])
            got = client.get_by_id(plain[42]["msg_id"])
        assert [m["tags"] for m in tagged] == [m["tags"] for m in batch if m["tags"] in ("tag1", "tag3")]
        return [plain, tagged, found, got]

    monkeypatch.setenv("RMQPY_PURE_PYTHON", "1")
    with EngineProcess(store_dir) as engine:
        with engine.client() as client:
            client.create_topic("orders", queue_count=1)
            results = client.send("orders", batch, queue_id=0)
        by_python = read_back(engine)
    writer_log = store_dir / LOG_DIR / "writer.log"
    assert writer_log.read_text().count("codec: python") == 1
    monkeypatch.delenv("RMQPY_PURE_PYTHON")
    with EngineProcess(store_dir) as engine:
        by_compiled = read_back(engine)
    assert writer_log.read_text().count("codec: compiled") == 1
    assert by_python == by_compiled
    assert_queue_intact(by_python[0], list(zip(batch, results, strict=True)), "orders", 0)


def test_lookups_follow_the_index_builder_while_it_writes_and_rolls(engine: EngineProcess, store_dir: Path) -> None:
    """The front answers lookups from IndexFiles the builder is still writing, and finds the
    next file when one fills up (test_min: 4,000 items a file; each message adds two)."""
    with engine.client() as client:
        client.create_topic("live", queue_count=2)
        assert client.query_by_key("live", "k0-0") == []  # no index file yet
        for round_no in range(12):
            batch = [{"body": b"%d-%d" % (round_no, n), "keys": [f"k{round_no}-{n}"]} for n in range(250)]
            results = client.send("live", batch)
            wait_dispatched(client)
            for probe_round, n in ((round_no, 249), (round_no, 0), (0, 17)):
                found = client.query_by_key("live", f"k{probe_round}-{n}")
                assert [m["body"] for m in found] == [b"%d-%d" % (probe_round, n)], (round_no, probe_round, n)
            uniq_key = client.get_by_id(results[-1]["msg_id"])["uniq_key"]
            [by_uniq] = client.query_by_key("live", uniq_key)
            assert by_uniq["msg_id"] == results[-1]["msg_id"]
    assert len(list((store_dir / "index").iterdir())) >= 2, "the index should have rolled to a second file"
