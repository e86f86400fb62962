"""Retention on a store with small segments and a short reservation time (a clock that moves)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine.client import EngineError
from engine.config import MiB, StoreConfig
from harness.workload import wait_dispatched
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(180)


def retention_config() -> StoreConfig:
    return StoreConfig.test_min().replace(segment_size_bytes=1 * MiB, message_body_bytes_max=64 * 1024,
                                          send_batch_bytes_max=256 * 1024, file_reserved_time_hours=0.0005,
                                          delete_when_hours="*", clean_resource_interval_ms=200)


def wait_min_offset_above(client, offset: int, timeout_s: float = 30) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        current = client.status()["offsets"]["min_offset"]
        if current > offset:
            return current
    raise AssertionError(f"the log's min offset stayed at or below {offset}")


def test_expired_segments_go_and_pulls_below_the_new_min_get_offset_too_small(store_dir: Path) -> None:
    engine = EngineProcess(store_dir, config=retention_config())
    engine.start()
    try:
        with engine.client() as client:
            client.create_topic("old", queue_count=1)
            first = client.send("old", [{"body": b"x" * 2000, "keys": [f"k{i}"]} for i in range(50)], queue_id=0)
            for _ in range(12):  # about 1.2 MiB per round trip: the log rolls into new segments
                client.send("old", [{"body": b"y" * 2000} for _ in range(50)], queue_id=0)
            wait_dispatched(client)
            assert (store_dir / "commitlog" / f"{0:020d}").exists()
            log_min = wait_min_offset_above(client, 0)
            wait_dispatched(client)
            # the expired segments are gone (the writer keeps preparing the next one meanwhile)
            assert min(int(p.name) for p in (store_dir / "commitlog").iterdir()) == log_min > 0
            deadline = time.monotonic() + 30
            while (reply := client.pull("old", 0, 0))["status"] != "OFFSET_TOO_SMALL":
                assert time.monotonic() < deadline, reply["status"]
            assert reply["next_offset"] == reply["min_offset"] > 0
            resumed = client.pull("old", 0, reply["next_offset"], max_messages=1)
            assert resumed["status"] == "FOUND"
            assert resumed["messages"][0]["commit_log_offset"] >= log_min
            with pytest.raises(EngineError) as info:
                client.get_by_id(first[0]["msg_id"])
            assert info.value.name == "MESSAGE_NOT_FOUND"
            assert client.query_by_key("old", "k0") == []
            [after] = client.send("old", [{"body": b"still writable"}], queue_id=0)
            assert after["status"] == "PUT_OK"
            min_before_restart = client.queue_stats("old", 0)["min_offset"]
    finally:
        assert engine.stop() == 0
    engine.config = engine.config.replace(file_reserved_time_hours=1000.0)
    engine.start()
    try:
        with engine.client() as client:
            assert client.queue_stats("old", 0)["min_offset"] >= min_before_restart
            assert client.pull("old", 0, 0)["status"] == "OFFSET_TOO_SMALL"
    finally:
        assert engine.stop() == 0


def test_a_disk_past_the_warning_level_refuses_sends(store_dir: Path) -> None:
    # Any real disk is fuller than these ratios: the warning level is crossed at once.
    config = retention_config().replace(file_reserved_time_hours=1000.0, disk_max_used_space_ratio=0.0001,
                                        disk_space_clean_forcibly_ratio=0.0001, disk_space_warning_level_ratio=0.0001)
    engine = EngineProcess(store_dir, config=config)
    engine.start()
    try:
        with engine.client() as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.send("full", [{"body": b"x"}])
                except EngineError as exc:
                    assert exc.name == "DISK_FULL"
                    break
                assert time.monotonic() < deadline, "sends were never refused"
    finally:
        engine.stop()
