"""``engine check`` verifies a store far larger than its memory limit, within that limit.

The store is built on real files (the writer's own append, then ``repair``
for the queues and the index) with a log of at least 100 times
``check_memory_bytes_max``; tracemalloc measures what the check allocates.
Before the check streamed, it kept a tuple per record: about 9 MB here,
against the 512 KiB limit.
"""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import tracemalloc
from pathlib import Path

import pytest

from engine.config import KiB, MiB, StoreConfig, encode_config
from engine.layout import HostAddress, RecordFields, encode_properties
from engine.offline.check import check_store
from engine.offline.repair import rebuild_derived
from engine.store.commit_log import CommitLogWriter
from engine.store.consume_queue import CQ_UNIT_BYTES, queue_dir

pytestmark = pytest.mark.timeout(300)

LIMIT = 512 * KiB
HOST = HostAddress.parse("127.0.0.1", 10911)
QUEUES = [("big", 0), ("big", 1), ("other", 0)]


def build_store(store_dir: Path, config: StoreConfig, log_bytes: int) -> int:
    """Append records of 1 KiB bodies with keys until the log holds ``log_bytes``; how many."""
    writer = CommitLogWriter(store_dir, config.segment_size_bytes, store_host=HOST, with_record_crc=True)
    next_offsets = dict.fromkeys(QUEUES, 0)
    count = 0
    try:
        while writer.written_offset < log_bytes:
            topic, queue_id = QUEUES[count // 16 % len(QUEUES)]
            batch = [RecordFields(topic.encode(), queue_id, bytes([n % 251]) * 1024,
                                  encode_properties({"KEYS": f"k{n}", "UNIQ_KEY": f"{n:032X}"}), flag=0,
                                  born_timestamp_ms=1_700_000_000_000 + n, born_host=HOST)
                     for n in range(count, count + 16)]
            writer.append(batch, first_queue_offset=next_offsets[(topic, queue_id)],
                          store_timestamp_ms=1_700_000_000_000 + count)
            next_offsets[(topic, queue_id)] += len(batch)
            count += len(batch)
        writer.flush(0, writer.written_offset)
    finally:
        writer.close()
    return count


@pytest.fixture(scope="module")
def big_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, StoreConfig]:
    store_dir = tmp_path_factory.mktemp("big") / "store"
    config = StoreConfig.test_min().replace(segment_size_bytes=4 * MiB, message_body_bytes_max=64 * KiB,
                                            check_memory_bytes_max=LIMIT)
    build_store(store_dir, config, 100 * LIMIT)
    rebuild_derived(store_dir, config)
    return store_dir, config


@pytest.mark.slow
def test_a_store_of_100_times_the_limit_is_checked_within_it(big_store: tuple[Path, StoreConfig]) -> None:
    store_dir, config = big_store
    log_bytes = sum(f.stat().st_size for f in (store_dir / "commitlog").iterdir())
    assert log_bytes >= 100 * LIMIT
    tracemalloc.start()
    try:
        findings = check_store(store_dir, config)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert findings == [], "\n".join(map(str, findings))
    assert peak < LIMIT, f"the check allocated {peak} bytes at its peak; the limit is {LIMIT}"


def test_a_damaged_unit_is_still_found(big_store: tuple[Path, StoreConfig], tmp_path: Path) -> None:
    store_dir, config = big_store
    first_file = sorted(queue_dir(store_dir, "big", 1).iterdir())[0]
    original = first_file.read_bytes()
    try:
        with open(first_file, "r+b") as f:  # unit 5 points at unit 6's record
            f.seek(5 * CQ_UNIT_BYTES)
            f.write(original[6 * CQ_UNIT_BYTES:7 * CQ_UNIT_BYTES])
        findings = [str(f) for f in check_store(store_dir, config)]
    finally:
        first_file.write_bytes(original)
    assert "consumequeue big/1@5: points at a record of big/1@6 (size 1114)" in findings[0] or \
        any(f.startswith("consumequeue big/1@5") for f in findings), findings


def test_the_command_shows_progress_on_a_terminal_only(big_store: tuple[Path, StoreConfig], tmp_path: Path) -> None:
    store_dir, config = big_store
    config_file = tmp_path / "store.json"
    config_file.write_bytes(encode_config(config))
    toml = tmp_path / "store.toml"
    toml.write_text(f"check_memory_bytes_max = {LIMIT}\nsegment_size_bytes = {config.segment_size_bytes}\n"
                    f"index_hash_slot_count = {config.index_hash_slot_count}\n"
                    f"index_item_count_max = {config.index_item_count_max}\n"
                    f"consume_queue_file_units = {config.consume_queue_file_units}\n"
                    f"message_body_bytes_max = {config.message_body_bytes_max}\n")
    command = [sys.executable, "-m", "engine", "check", "--store-dir", str(store_dir), "--config", str(toml)]
    piped = subprocess.run(command, capture_output=True, timeout=240, check=False)
    assert piped.returncode == 0, piped.stderr
    assert b"%|" not in piped.stderr, "no bar when stderr is not a terminal"
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    try:
        at_terminal = subprocess.run(command, stdout=subprocess.PIPE, stderr=follower, timeout=240, check=False)
        os.close(follower)
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child's side is closed and everything was read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(leader)
    assert at_terminal.returncode == 0
    assert b"log" in drawn and b"100%|" in drawn and b"index" in drawn, drawn[-500:]
