"""Reads in the caller's process over the shared mapped files (``engine/local_reads.py``) answer what
the engine answers over its socket, wait for new messages without a socket per batch, and survive
retention deleting the segments they had mapped."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import msgspec
import pytest

from engine.client import StoreClient
from engine.errors import RequestError
from engine.ipc.endpoints import NotRunning
from engine.ipc.protocol import PullReply
from engine.local_reads import LocalReads
from harness.workload import wait_dispatched
from supervisor.launcher import EngineProcess
from tests.integration.test_retention import retention_config, wait_min_offset_above

pytestmark = pytest.mark.timeout(90)


def _same(local: PullReply, remote: dict) -> None:
    assert local == msgspec.convert({**remote, "id": 0}, PullReply)  # the id is the network request's
    assert len(local.messages) == len(remote["messages"])


def test_pulls_lookups_and_reads_by_id_answer_as_the_engine_does(engine: EngineProcess, store_dir: Path) -> None:
    with engine.client() as client, LocalReads(store_dir) as local:
        client.create_topic("orders", queue_count=2)
        sent = client.send("orders", [{"body": b"m%d" % i, "keys": [f"order-{i}"], "tags": "TagA" if i % 2 else "TagB"}
                                      for i in range(40)], queue_id=1)
        wait_dispatched(client)
        for offset, max_messages in ((0, 32), (32, 32), (40, 5), (41, 5)):
            _same(local.pull("orders", 1, offset, max_messages=max_messages),
                  client.pull("orders", 1, offset, max_messages=max_messages))
        _same(local.pull("orders", 1, 0, subscription="TagA"), client.pull("orders", 1, 0, subscription="TagA"))
        _same(local.pull("orders", 0, 0), client.pull("orders", 0, 0))
        _same(local.pull("nowhere", 0, 0), client.pull("orders", 0, 0))  # no such queue: as an empty one
        assert local.query_by_key("orders", "order-7") == client.query_by_key("orders", "order-7")
        assert [m["body"] for m in local.query_by_key("orders", "order-7")] == [b"m7"]
        assert local.get_by_id(sent[3]["msg_id"]) == client.get_by_id(sent[3]["msg_id"])
        offset = sent[3]["commit_log_offset"] if "commit_log_offset" in sent[3] else \
            client.get_by_id(sent[3]["msg_id"])["commit_log_offset"]
        assert local.get_by_offset(offset)["body"] == b"m3"
        with pytest.raises(RequestError) as info:
            local.get_by_offset(10**12)
        assert info.value.code.name == "MESSAGE_NOT_FOUND"
        with pytest.raises(RequestError) as info:
            local.get_by_id("not-an-id")
        assert info.value.code.name == "INVALID_MSG_ID"


def test_a_long_poll_is_answered_when_a_message_arrives(engine: EngineProcess, store_dir: Path) -> None:
    with engine.client() as client, LocalReads(store_dir) as local:
        client.create_topic("jobs", queue_count=1)
        client.send("jobs", [{"body": b"first"}], queue_id=0)
        wait_dispatched(client)
        assert local.pull("jobs", 0, 1).status == "OFFSET_OVERFLOW_ONE"
        sender = threading.Timer(0.5, lambda: StoreClient(engine.endpoint).send("jobs", [{"body": b"later"}],
                                                                              queue_id=0))
        started = time.monotonic()
        sender.start()
        try:
            reply = local.pull("jobs", 0, 1, max_wait_ms=10_000)
        finally:
            sender.join()
        waited = time.monotonic() - started
        assert [m.body for m in reply.messages] == [b"later"]
        assert 0.4 < waited < 5, waited  # woken by the message, not by the end of the wait
        started = time.monotonic()
        assert local.pull("jobs", 0, 2, max_wait_ms=300).status == "OFFSET_OVERFLOW_ONE"
        assert time.monotonic() - started >= 0.29  # nothing came: the whole wait


def test_retention_deleting_mapped_segments_under_a_reader_is_no_crash(store_dir: Path) -> None:
    engine = EngineProcess(store_dir, config=retention_config())
    engine.start()
    try:
        with engine.client() as client, LocalReads(store_dir) as local:
            client.create_topic("old", queue_count=1)
            client.send("old", [{"body": b"x" * 2000, "keys": ["first"]} for _ in range(50)], queue_id=0)
            wait_dispatched(client)
            assert local.pull("old", 0, 0, max_messages=8).status == "FOUND"  # segment 0 is mapped here now
            assert local.query_by_key("old", "first")
            for _ in range(12):  # the log rolls into new segments; the first ones expire
                client.send("old", [{"body": b"y" * 2000} for _ in range(50)], queue_id=0)
            wait_dispatched(client)
            log_min = wait_min_offset_above(client, 0)
            deadline = time.monotonic() + 30
            while (reply := local.pull("old", 0, 0)).status != "OFFSET_TOO_SMALL":
                assert time.monotonic() < deadline, reply.status
            assert reply.next_offset == reply.min_offset > 0
            resumed = local.pull("old", 0, reply.next_offset, max_messages=1)
            assert resumed.status == "FOUND" and resumed.messages[0].commit_log_offset >= log_min
            assert local.query_by_key("old", "first") == []
    finally:
        engine.stop()


def test_lookups_racing_the_index_builder_find_only_whole_entries(engine: EngineProcess, store_dir: Path) -> None:
    """Key lookups in the reader's process while the index builder adds entries: every message
    found carries the key (a slot or an item read half-published would lead elsewhere)."""
    with engine.client() as client, LocalReads(store_dir) as local:
        client.create_topic("race", queue_count=1)

        def produce() -> None:
            with StoreClient(engine.endpoint) as producer:
                for first in range(0, 4_000, 20):
                    batch = [{"body": b"r%d" % n, "keys": [f"k{n % 50}"]} for n in range(first, first + 20)]
                    producer.send("race", batch, queue_id=0)

        producer = threading.Thread(target=produce)
        producer.start()
        lookups = found = 0
        try:
            while producer.is_alive():
                key = lookups % 50
                for message in local.query_by_key("race", f"k{key}", max_results=64):
                    assert f"k{key}" in message["keys"] and int(message["body"][1:]) % 50 == key, message
                    found += 1
                lookups += 1
        finally:
            producer.join()
        wait_dispatched(client)
        assert lookups > 20 and found > 0, (lookups, found)
        count_max = min(80, engine.config.query_result_count_max)  # k7 is on 80 messages
        everything = local.query_by_key("race", "k7", max_results=count_max)
        assert everything == client.query_by_key("race", "k7", max_results=count_max)
        assert len(everything) == count_max
        assert {int(m["body"][1:]) for m in everything} <= set(range(7, 4_000, 50))


def test_no_engine_is_said_plainly(store_dir: Path) -> None:
    with pytest.raises(NotRunning, match="no engine is running"):
        LocalReads(store_dir)


def test_a_reader_follows_the_engine_over_a_restart(engine: EngineProcess, store_dir: Path) -> None:
    """A stopped engine's run directory goes, and the next start maps new shared offsets: a reader
    that lives through it (a consumer process on the host) must not keep the last run's offsets,
    which would end its reads where that run stopped."""
    with engine.client() as client:
        client.create_topic("jobs", queue_count=1)
        client.send("jobs", [{"body": b"before"}], queue_id=0)
        wait_dispatched(client)
    with LocalReads(store_dir) as local:
        assert [m.body for m in local.pull("jobs", 0, 0).messages] == [b"before"]
        engine.stop()
        engine.start()
        with engine.client() as client:
            client.send("jobs", [{"body": b"after"}], queue_id=0)
            wait_dispatched(client)
        assert [m.body for m in local.pull("jobs", 0, 0).messages] == [b"before", b"after"]
        assert [m.body for m in local.pull("jobs", 0, 1, max_wait_ms=5_000).messages] == [b"after"]
