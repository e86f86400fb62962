"""A master and its replica as real engines on loopback: the replica holds the master's log byte for
byte, builds its own queues and index from it, serves reads, and refuses writes; replication's
actors killed under load lose and duplicate nothing; a replica that cannot follow is told why.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rmqpy
from engine.client import EngineError, StoreClient
from engine.config import StoreConfig
from engine.errors import ErrorCode
from engine.ipc.control import EventStream, control
from engine.ipc.messages import StatusQuery
from engine.offline.check import check_store
from harness.faults import kill_actor
from harness.replication import log_bytes, offsets, replicated_pair, wait_replicated
from harness.workload import Producer, ProducerThread, read_everything, verify
from rmqpy.aio import AsyncProducer
from supervisor.launcher import EngineProcess, free_port

pytestmark = pytest.mark.timeout(120)

TOPICS = {"alpha": 4, "beta": 2}


def small_segments() -> StoreConfig:
    return StoreConfig.test_min().replace(segment_size_bytes=1 << 20, message_body_bytes_max=64 * 1024,
                                          send_batch_bytes_max=256 * 1024, replication_report_interval_ms=200,
                                          replication_config_interval_ms=200)


def fill(client: StoreClient, rng: random.Random, batches: int) -> None:
    for n in range(batches):
        topic = rng.choice(sorted(TOPICS))
        client.send(topic, [{"body": rng.randbytes(rng.choice((40, 900, 20_000))), "keys": [f"k{n}-{i}"],
                             "tags": rng.choice("AB")} for i in range(rng.randint(1, 12))])


def assert_same_stores(master: EngineProcess, replica: EngineProcess, config: StoreConfig) -> None:
    with master.client() as mc, replica.client() as rc:
        end = wait_replicated(mc, rc)
        deadline = time.monotonic() + 15  # the topic table comes beside the log, every config interval
        while not {t["topic"] for t in rc.list_topics()} >= set(TOPICS):
            assert time.monotonic() < deadline, "the master's topics never reached the replica"
        assert log_bytes(replica.store_dir, 0, end, config.segment_size_bytes) == \
            log_bytes(master.store_dir, 0, end, config.segment_size_bytes)
        assert read_everything(rc, TOPICS) == read_everything(mc, TOPICS)


def test_a_replica_holds_the_masters_log_and_serves_reads_of_it(tmp_path: Path) -> None:
    config = small_segments()
    with replicated_pair(tmp_path, config) as (master, replica):
        with master.client() as client:
            for topic, queues in TOPICS.items():
                client.create_topic(topic, queue_count=queues)
            fill(client, random.Random(1), 300)  # about 5 segments of 1 MiB
            client.commit_offset("readers", "alpha", 1, 7)
            client.delete_topic("beta")  # its queues start again at 0 on the replica too
            client.create_topic("beta", queue_count=2)
            client.send("beta", [{"body": b"after the deletion", "keys": ["again"]}], queue_id=1)
        assert_same_stores(master, replica, config)
        with master.client() as mc, replica.client() as rc:
            assert len(list((replica.store_dir / "commitlog").iterdir())) > 3
            assert rc.query_by_key("alpha", "k5-0") == mc.query_by_key("alpha", "k5-0")
            assert [m["body"] for m in rc.pull("beta", 1, 0)["messages"]] == [b"after the deletion"]
            assert {t["topic"] for t in rc.list_topics()} >= set(TOPICS)
            refusals = [lambda: rc.send("alpha", [{"body": b"x"}]), lambda: rc.create_topic("gamma"),
                        lambda: rc.commit_offset("readers", "alpha", 0, 1), lambda: rc.delete_topic("alpha"),
                        lambda: rc.pop("g", "alpha", max_messages=1)]
            for write in refusals:
                with pytest.raises(EngineError) as refused:
                    write()
                assert refused.value.code == ErrorCode.NOT_MASTER, refused.value
                assert refused.value.details["master_endpoint"] == master.endpoint  # where to send it instead
                assert master.endpoint in refused.value.message
        for engine, role in ((master, "master (replicas in sync: 1)"), (replica, "replica")):
            shown = subprocess.run([sys.executable, "-m", "supervisor", "status", "--store-dir", str(engine.store_dir),
                                    "--json"], capture_output=True, text=True, check=True, timeout=30)
            assert json.loads(shown.stdout)["role"] == role
        with rmqpy.Producer(replica.endpoint) as producer:  # pointed at the replica: it sends to the master named
            assert producer.send("alpha", b"to the master", queue_id=3).ok
            assert producer.endpoint == master.endpoint

        async def send_async() -> str:
            async with AsyncProducer(replica.endpoint) as producer:
                await producer.send("alpha", b"to the master too", queue_id=3)
                return producer.client.endpoint

        assert asyncio.run(send_async()) == master.endpoint
        produced = subprocess.run([sys.executable, "-m", "engine", "produce", "--endpoint", replica.endpoint, "--topic",
                                   "alpha", "--count", "2", "--queue-id", "3"], capture_output=True, text=True,
                                  check=False, timeout=60)
        assert produced.returncode == 0, produced.stderr
        assert f"is a replica; sending to its master, {master.endpoint}" in produced.stderr
        with master.client() as mc:
            bodies: list[bytes] = []
            deadline = time.monotonic() + 15
            while bodies[-4:-2] != [b"to the master", b"to the master too"]:  # the CLI's two, dispatched after
                assert time.monotonic() < deadline, bodies[-4:]
                bodies = [m["body"] for m in mc.pull("alpha", 3, 0, max_messages=1000)["messages"]]
        with replica.client() as rc:  # the master's offsets reach the replica with its config files
            deadline = time.monotonic() + 15
            while rc.fetch_offset("readers", "alpha", 1) != 7:
                assert time.monotonic() < deadline, "the master's committed offset never reached the replica"
    assert check_store(replica.store_dir, replica.config) == []


@pytest.mark.slow
def test_killing_replication_and_the_replicas_writer_under_load_loses_and_repeats_nothing(tmp_path: Path) -> None:
    config = small_segments()
    rng = random.Random(7)
    with replicated_pair(tmp_path, config) as (master, replica):
        client = master.client(timeout_ms=3_000)
        producer = Producer("p", client, TOPICS, random.Random(3), body_sizes=(40, 300, 2000), batch_size=8)
        thread = ProducerThread(producer).start()
        for round_ in range(9):
            thread.wait_acked(len(producer.acked) + 200, timeout_s=30)
            engine, role = [(master, "replication-sender"), (replica, "replication-receiver"),
                            (replica, "writer")][round_ % 3]
            events = EventStream(engine.store_dir)
            try:
                kill_actor(engine.store_dir, role, rng=rng)
                events.wait_for("actor.exited", name=role)
                events.wait_for("recovery.done", name=role)  # back before the next round kills it again
            finally:
                events.close()
        thread.stop()
        client.close()
        with master.client() as mc:
            verdict = verify([producer], read_everything(mc, TOPICS))
        assert verdict.ok() and verdict.acked > 0, verdict.summary()
        assert_same_stores(master, replica, config)
    assert check_store(replica.store_dir, replica.config) == []


@pytest.mark.slow  # 5.5 s: a replica started twice
def test_an_empty_replica_catches_up_and_one_ahead_of_its_master_is_told_why(tmp_path: Path) -> None:
    config = small_segments()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    master = EngineProcess(tmp_path / "master", config=config.replace(replication_endpoint=endpoint))
    with master:
        with master.client() as client:
            for topic, queues in TOPICS.items():
                client.create_topic(topic, queue_count=queues)
            fill(client, random.Random(2), 120)
        with EngineProcess(tmp_path / "replica", config=config.replace(replica_of=endpoint)) as replica:
            assert_same_stores(master, replica, config)
        ahead = tmp_path / "ahead"
        shutil.copytree(tmp_path / "replica", ahead)  # a replica that holds more than a fresh master
    fresh = EngineProcess(tmp_path / "fresh", config=config.replace(replication_endpoint=endpoint))
    with fresh, EngineProcess(ahead, config=config.replace(replica_of=endpoint)) as replica:
        reasons: list[str] = []
        deadline = time.monotonic() + 15
        while not any("past this master's" in reason for reason in reasons):
            assert time.monotonic() < deadline, f"the replica never said why it cannot follow: {reasons}"
            reply = control(replica.store_dir, StatusQuery())
            reasons = list(reply.reasons) if reply.state == "DEGRADED" else []
        with replica.client() as rc:
            assert offsets(rc)["written_offset"] > 0  # nothing of its own is lost


def wait_in_sync(client: StoreClient, count: int) -> None:
    deadline = time.monotonic() + 20
    while offsets(client)["in_sync_replicas"] != count:
        assert time.monotonic() < deadline, f"never {count} replicas in sync: {offsets(client)}"


def test_sync_replication_answers_once_the_replica_holds_a_send_and_refuses_without_one(tmp_path: Path) -> None:
    config = small_segments().replace(replication_mode="SYNC", replica_lag_max_ms=1_000, sync_flush_timeout_ms=1_000)
    with replicated_pair(tmp_path, config) as (master, replica), master.client() as mc:
        mc.create_topic("alpha", queue_count=4)
        wait_in_sync(mc, 1)
        for n in range(20):
            [result] = mc.send("alpha", [{"body": b"m%d" % n}], queue_id=0)
            assert result["status"] == "PUT_OK", result
            with replica.client() as rc:  # held by the replica before the answer came
                assert offsets(rc)["written_offset"] > result["commit_log_offset"]
        replica.stop()
        statuses = []
        deadline = time.monotonic() + 20
        while not statuses or statuses[-1] != "SLAVE_NOT_AVAILABLE":
            assert time.monotonic() < deadline, statuses
            try:
                statuses.append(mc.send("alpha", [{"body": b"late"}], queue_id=1)[0]["status"])
            except EngineError as exc:
                statuses.append(exc.name)
        assert set(statuses) <= {"FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"}, statuses
        timed_out = statuses.count("FLUSH_SLAVE_TIMEOUT")
        assert mc.pull("alpha", 1, 0)["messages"] == []  # stored, never seen while no replica holds them
        replica.start()
        wait_in_sync(mc, 1)
        assert mc.send("alpha", [{"body": b"back"}], queue_id=1)[0]["status"] == "PUT_OK"
        bodies: list[bytes] = []
        deadline = time.monotonic() + 15
        while b"back" not in bodies:  # dispatched after its answer, as any send
            assert time.monotonic() < deadline, bodies
            bodies = [m["body"] for m in mc.pull("alpha", 1, 0, max_messages=100)["messages"]]
        assert bodies == [b"late"] * timed_out + [b"back"]
