"""Disk footprint: RocketMQ's file sizes on disk, real blocks only for what is written.

A CommitLog segment stays 1 GiB long and a ConsumeQueue file 6,000,000 bytes (RocketMQ's
readers expect those sizes), but their blocks are reserved with fallocate ahead of the
writes: an empty store takes a few MiB, not the 2.1 GB it took with whole preallocation.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.client import EngineError
from engine.config import ConfigError, StoreConfig
from harness.workload import wait_dispatched
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(90)

MiB = 1 << 20


def allocated_bytes(directory: Path) -> int:
    """What ``du`` counts: the blocks the files really hold."""
    return sum(os.stat(Path(root) / name).st_blocks * 512 for root, _dirs, files in os.walk(directory)
               for name in files)


def logical_bytes(directory: Path) -> int:
    return sum(os.stat(Path(root) / name).st_size for root, _dirs, files in os.walk(directory) for name in files)


def rocketmq_sized() -> StoreConfig:
    """test_min's intervals with RocketMQ's default file sizes (1 GiB segments, 6,000,000-byte
    ConsumeQueue files, 5 M index slots, a 2-week timer wheel)."""
    default = StoreConfig()
    return StoreConfig.test_min().replace(
        segment_size_bytes=default.segment_size_bytes, consume_queue_file_units=default.consume_queue_file_units,
        index_hash_slot_count=default.index_hash_slot_count, index_item_count_max=default.index_item_count_max,
        timer_max_delay_ms=default.timer_max_delay_ms, timer_wheel_slots=default.timer_wheel_slots,
        timer_log_segment_bytes=default.timer_log_segment_bytes)


def test_an_empty_store_and_a_few_megabytes_take_little_disk_with_rocketmq_file_sizes(tmp_path: Path) -> None:
    engine = EngineProcess(tmp_path / "store", config=rocketmq_sized())
    engine.start()
    try:
        client = engine.client(timeout_ms=10_000)
        client.send("Warm", [{"body": b"x", "keys": ["k"]}])  # one index file and one queue file exist
        wait_dispatched(client, timeout_ms=30_000)
        empty = allocated_bytes(engine.store_dir)
        body = os.urandom(4_000)
        for batch in range(64):  # 1,024 messages of 4 KB: 4.1 MB of records
            client.send("Footprint", [{"body": body, "keys": [f"k{batch}-{i}"]} for i in range(16)], queue_id=0)
        wait_dispatched(client, timeout_ms=30_000)
        loaded = allocated_bytes(engine.store_dir)
        client.close()
    finally:
        engine.stop()
    store = engine.store_dir
    # The formats keep their sizes: RocketMQ's readers map these files whole.
    assert {p.stat().st_size for p in (store / "commitlog").iterdir()} == {1 << 30}
    assert {p.stat().st_size for p in (store / "consumequeue" / "Footprint" / "0").iterdir()} == {6_000_000}
    assert logical_bytes(store) > 1 << 30
    # 20 MB of them are the index file's 5 M hash slots, written in any order and so reserved whole.
    assert empty < 48 * MiB, f"an empty store takes {empty / MiB:.1f} MiB"
    assert loaded - empty < 4.1 * MiB + 40 * MiB, f"4.1 MB of messages took {(loaded - empty) / MiB:.1f} MiB"
    print(f"\ndisk used: one message {empty / MiB:.1f} MiB, after 4.1 MB {loaded / MiB:.1f} MiB "
          f"(files {logical_bytes(store) / MiB:.0f} MiB long)")


def test_a_queue_with_one_message_takes_a_page_not_six_megabytes(tmp_path: Path) -> None:
    engine = EngineProcess(tmp_path / "store", config=rocketmq_sized())
    engine.start()
    try:
        client = engine.client(timeout_ms=10_000)
        for n in range(20):
            client.send(f"Auto{n}", [{"body": b"one"}], queue_id=0)
        wait_dispatched(client, timeout_ms=30_000)
        client.close()
    finally:
        engine.stop()
    queues = engine.store_dir / "consumequeue"
    files = [p for p in queues.rglob("*") if p.is_file() and p.parent.parent.name.startswith("Auto")]
    assert len(files) == 20 and {p.stat().st_size for p in files} == {6_000_000}
    used = sum(p.stat().st_blocks * 512 for p in files)
    assert used <= 20 * 16 * 1024, f"20 one-message queues take {used} bytes of disk"


def test_auto_created_topics_are_bounded_with_a_stable_code(tmp_path: Path) -> None:
    engine = EngineProcess(tmp_path / "store", config=StoreConfig.test_min().replace(auto_create_topics_max=3))
    engine.start()
    try:
        client = engine.client(timeout_ms=10_000)
        for n in range(3):
            client.send(f"Auto{n}", [{"body": b"one"}])
        with pytest.raises(EngineError) as info:
            client.send("Auto3", [{"body": b"one"}])
        assert info.value.name == "LIMIT_EXCEEDED" and "auto_create_topics_max" in str(info.value)
        client.create_topic("Explicit", queue_count=1)  # an operator's topic is not auto-created
        assert client.send("Explicit", [{"body": b"one"}])[0]["status"] == "PUT_OK"
        assert client.send("Auto0", [{"body": b"two"}])[0]["status"] == "PUT_OK"
        client.close()
    finally:
        engine.stop()


def test_the_dev_profile_gives_small_files_and_a_file_may_override_it(tmp_path: Path) -> None:
    path = tmp_path / "engine.toml"
    path.write_text('profile = "dev"\nindex_hash_slot_count = 50000\n')
    config = StoreConfig.load(path)
    assert config.profile == "dev"
    assert config.segment_size_bytes == 64 * MiB and config.index_hash_slot_count == 50_000
    assert config.timer_wheel_slots * 32 < 6 * MiB
    assert StoreConfig.load(None).segment_size_bytes == 1 << 30
    path.write_text('profile = "tiny"\n')
    with pytest.raises(ConfigError, match="profile"):
        StoreConfig.load(path)
