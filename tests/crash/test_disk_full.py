"""Disk full on a real size-limited filesystem (a tmpfs mounted for the test; needs root).

Sends must get a clear DISK_FULL error (never an acknowledgement for
something not stored), no actor may die by a signal (segments are
preallocated, so no write lands in a sparse mapping), every acknowledged
message stays readable, and sends succeed again once space is freed.
"""

from __future__ import annotations

import os
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.client import EngineError
from engine.config import StoreConfig
from supervisor.control import control
from supervisor.launcher import EngineProcess
from supervisor.workload import Producer, read_everything, verify, wait_dispatched

pytestmark = pytest.mark.timeout(180)

TOPICS = {"full": 2}
MiB = 1 << 20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount_point)],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


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
        status = control(engine.store_dir, "status")
        assert all(actor.restarts == 0 for actor in status.actors), [(a.name, a.restarts) for a in status.actors]
        client.close()
    finally:
        engine.stop()
