"""Disk full on a real size-limited filesystem (a tmpfs mounted for the test; needs root).

Sends must get a clear DISK_FULL error (never an acknowledgement for
something not stored), no actor may die by a signal (segments are
preallocated, so no write lands in a sparse mapping), every acknowledged
message stays readable, and sends succeed again once space is freed.
By default a full disk deletes nothing that has not expired; deleting
unexpired segments is ``disk_space_clean_forcibly``, logged and counted.
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.client import EngineError
from engine.config import StoreConfig
from engine.ipc.control import control
from engine.ipc.messages import StatusQuery
from harness.workload import Producer, read_everything, verify, wait_dispatched
from supervisor.launcher import EngineProcess
from tests.helpers import size_limited_tmpfs

pytestmark = pytest.mark.timeout(180)

TOPICS = {"full": 2}
MiB = 1 << 20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with size_limited_tmpfs(tmp_path, "24m") as mount_point:
        yield mount_point


def test_disk_full_refuses_sends_clearly_and_recovers_when_space_is_freed(small_disk: Path) -> None:
    ballast = small_disk / "ballast"
    with open(ballast, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, 6 * MiB)
    config = StoreConfig.test_min().replace(segment_size_bytes=2 * MiB, message_body_bytes_max=64 * 1024,
                                            send_batch_bytes_max=256 * 1024)
    engine = EngineProcess(small_disk / "store", config=config)
    engine.start()
    try:
        client = engine.client(timeout_ms=5_000)
        producer = Producer("p", client, TOPICS, random.Random(1), body_sizes=(4000,), batch_size=16)
        client.create_topic("full", queue_count=2)
        deadline = time.monotonic() + 60
        while producer.errors.get("DISK_FULL", 0) == 0:
            assert time.monotonic() < deadline, f"the disk never filled: {dict(producer.errors)}"
            producer.send_batch()
        assert set(producer.errors) == {"DISK_FULL"}, dict(producer.errors)
        with pytest.raises(EngineError) as info:
            client.send("full", [{"body": b"x" * 60_000}] * 4, queue_id=0)
        assert info.value.name == "DISK_FULL"
        ballast.unlink()
        deadline = time.monotonic() + 30
        while producer.send_batch() == 0:
            assert time.monotonic() < deadline, f"sends never succeeded again: {dict(producer.errors)}"
        acked_before = len(producer.acked)
        for _ in range(5):
            producer.send_batch()
        assert len(producer.acked) == acked_before + 5 * producer.batch_size
        wait_dispatched(client, timeout_ms=30_000)
        verdict = verify([producer], read_everything(client, TOPICS))
        assert verdict.ok(), verdict.summary()
        status = control(engine.store_dir, StatusQuery())
        assert all(actor.restarts == 0 for actor in status.actors), [(a.name, a.restarts) for a in status.actors]
        client.close()
    finally:
        engine.stop()


def writer_detail(engine: EngineProcess) -> dict[str, int]:
    [writer] = [a for a in control(engine.store_dir, StatusQuery()).actors if a.name == "writer"]
    return writer.detail


def wait_writer(engine: EngineProcess, what: str, predicate, *, timeout_s: float = 60.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while not predicate(detail := writer_detail(engine)):
        assert time.monotonic() < deadline, f"the writer never reached {what}: {detail}"
        time.sleep(0.05)  # polling the supervisor's status, with a deadline
    return detail


def fill_until_refused(producer: Producer) -> None:
    deadline = time.monotonic() + 60
    while producer.errors.get("DISK_FULL", 0) == 0:
        assert time.monotonic() < deadline, f"the disk never filled: {dict(producer.errors)}"
        producer.send_batch()


def full_disk_config(**changes: object) -> StoreConfig:
    return StoreConfig.test_min().replace(segment_size_bytes=2 * MiB, message_body_bytes_max=64 * 1024,
                                          send_batch_bytes_max=256 * 1024, clean_resource_interval_ms=100,
                                          **changes)


def test_a_full_disk_deletes_no_unexpired_message_by_default(small_disk: Path) -> None:
    engine = EngineProcess(small_disk / "store", config=full_disk_config())
    engine.start()
    try:
        client = engine.client(timeout_ms=5_000)
        client.create_topic("full", queue_count=2)
        producer = Producer("p", client, TOPICS, random.Random(2), body_sizes=(4000,), batch_size=16)
        fill_until_refused(producer)
        rounds = writer_detail(engine)["retention_rounds"]
        # Several retention rounds with the disk past every ratio, forced cleaning's included.
        detail = wait_writer(engine, "5 more retention rounds", lambda d: d["retention_rounds"] >= rounds + 5)
        assert detail["forced_deleted_segments"] == 0
        wait_dispatched(client, timeout_ms=30_000)
        assert [client.queue_stats("full", q)["min_offset"] for q in range(2)] == [0, 0]
        verdict = verify([producer], read_everything(client, TOPICS))
        assert verdict.ok(), verdict.summary()
        assert verdict.acked > 1_000
        client.close()
    finally:
        engine.stop()


def test_forced_cleaning_is_explicit_and_logs_and_counts_what_it_deletes(small_disk: Path) -> None:
    engine = EngineProcess(small_disk / "store", config=full_disk_config(disk_space_clean_forcibly=True))
    engine.start()
    try:
        client = engine.client(timeout_ms=5_000)
        client.create_topic("full", queue_count=2)
        producer = Producer("p", client, TOPICS, random.Random(3), body_sizes=(4000,), batch_size=16)
        deadline = time.monotonic() + 60
        while writer_detail(engine)["forced_deleted_messages"] == 0:
            assert time.monotonic() < deadline, f"nothing was deleted forcibly: {writer_detail(engine)}"
            producer.send_batch()
        client.close()
    finally:
        engine.stop()
    log_text = (engine.store_dir / "logs" / "writer.log").read_text()
    counted = re.findall(r"deleted unexpired segment \d{20}: (\d+) messages, stored from \S+ to \S+", log_text)
    assert counted and sum(map(int, counted)) > 0, log_text[-2000:]
