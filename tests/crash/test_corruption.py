"""Corruption: truncated tails, bit flips in records, queue units, index and checkpoint.

Every kind of damage must be detected, the damaged thing never served, the
records after it kept, and derived files rebuilt from the log.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from engine.client import EngineError
from engine.config import StoreConfig
from engine.layout import CQ_UNIT_BYTES, HostAddress, Record, RecordFields, encode_properties
from engine.offline.check import check_store
from engine.offline.repair import rebuild_derived
from engine.services.recovery import plan_commit_log_recovery
from engine.store.commit_log import COMMIT_LOG_DIR, CommitLogReader, CommitLogWriter
from engine.store.consume_queue import ConsumeQueue, list_queues
from engine.store.mapped_file import list_files
from harness.workload import Producer, parse_body, read_everything, verify, wait_dispatched
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(240)

TOPICS = {"c": 3}
SEGMENT_BYTES = 256 * 1024


def small_config() -> StoreConfig:
    return StoreConfig.test_min().replace(segment_size_bytes=SEGMENT_BYTES, message_body_bytes_max=16 * 1024,
                                          send_batch_bytes_max=64 * 1024)


def flip_bit(path: Path, byte_offset: int, bit: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        old = os.pread(fd, 1, byte_offset)[0]
        os.pwrite(fd, bytes([old ^ (1 << bit)]), byte_offset)
    finally:
        os.close(fd)


def populate(store_dir: Path, *, batches: int = 60) -> Producer:
    """A stopped store holding ``batches`` x 8 verifiable messages over several segments."""
    engine = EngineProcess(store_dir, config=small_config())
    engine.start()
    try:
        producer = Producer("p", engine.client(), TOPICS, random.Random(5), body_sizes=(100, 700, 3000))
        for _ in range(batches):
            assert producer.send_batch() == producer.batch_size
        with producer.client as client:
            wait_dispatched(client)
    finally:
        assert engine.stop() == 0
    assert len(list_files(store_dir / COMMIT_LOG_DIR)) >= (3 if batches >= 60 else 1)
    return producer


def all_records(store_dir: Path) -> list[Record]:
    reader = CommitLogReader(store_dir, SEGMENT_BYTES)
    last = reader.segments.last_offset()
    assert last is not None
    return [r for r in reader.scan(0, last + SEGMENT_BYTES, check_crc=True) if isinstance(r, Record)]


def segment_path(store_dir: Path, offset: int) -> tuple[Path, int]:
    start = offset - offset % SEGMENT_BYTES
    return store_dir / COMMIT_LOG_DIR / f"{start:020d}", offset - start


# -- torn tails ------------------------------------------------------------------------------

def write_log(directory: Path, count: int) -> list[tuple[int, int]]:
    writer = CommitLogWriter(directory, SEGMENT_BYTES, store_host=HostAddress.parse("127.0.0.1", 10911),
                             with_record_crc=True)
    positions = []
    for i in range(count):
        fields = RecordFields(b"torn", 0, b"body-%d" % i * 7, encode_properties({"KEYS": f"k{i}"}), 0, 1,
                              HostAddress.parse("10.0.0.1", 1))
        positions += writer.append([fields], first_queue_offset=i, store_timestamp_ms=1000 + i).positions
    writer.close()
    return positions


@pytest.mark.parametrize("filler", ["zeros", "garbage"])
def test_a_tail_torn_at_every_byte_of_the_last_records_recovers_to_the_last_whole_record(
        tmp_path: Path, filler: str) -> None:
    positions = write_log(tmp_path, 40)
    path = tmp_path / COMMIT_LOG_DIR / f"{0:020d}"
    original = path.read_bytes()
    log_end = positions[-1][0] + positions[-1][1]
    boundaries = [offset for offset, _size in positions] + [log_end]
    rng = random.Random(1)
    config = StoreConfig.test_min().replace(segment_size_bytes=SEGMENT_BYTES, message_body_bytes_max=1024)
    for cut in range(positions[-3][0], log_end):
        torn = bytearray(original)
        torn[cut:log_end] = bytes(log_end - cut) if filler == "zeros" else rng.randbytes(log_end - cut)
        path.write_bytes(torn)
        plan = plan_commit_log_recovery(tmp_path, config)
        expected = max(b for b in boundaries if b <= cut)
        assert plan.end_offset == expected, f"cut at {cut}: recovered to {plan.end_offset}, expected {expected}"
        assert plan.damage == [], f"cut at {cut}: a torn tail is not damage in the middle"
        assert plan.next_queue_offsets[("torn", 0)] == boundaries.index(expected)


# -- bit flips in records ----------------------------------------------------------------------

def test_bit_flips_in_records_are_detected_never_served_and_later_records_kept(store_dir: Path) -> None:
    producer = populate(store_dir)
    records = all_records(store_dir)
    rng = random.Random(3)
    damaged = rng.sample(records[:-1], 12)
    for record in damaged:
        # Anywhere but the CRC property itself (its 20 bytes are checked by other means).
        at = record.commit_log_offset + rng.randrange(record.total_size - 20)
        path, pos = segment_path(store_dir, at)
        flip_bit(path, pos, rng.randrange(8))
    damaged_offsets = {r.commit_log_offset for r in damaged}
    log_end = records[-1].commit_log_offset + records[-1].total_size

    engine = EngineProcess(store_dir, config=small_config())
    engine.start()
    try:
        with engine.client() as client:
            read = read_everything(client, TOPICS)
            verdict = verify([producer], read)
            assert not verdict.corrupt and not verdict.misplaced and not verdict.storage_duplicates
            served = {m["commit_log_offset"] for q in read.values() for m in q.messages}
            assert not served & damaged_offsets, "a damaged record was served"
            assert len(verdict.lost) == len(damaged), "exactly the damaged records are missing"
            assert sum(len(q.holes) for q in read.values()) >= len(damaged) - 1
            for record in damaged:
                with pytest.raises(EngineError) as info:
                    client.get_by_id(record.msg_id)
                assert info.value.name in ("MESSAGE_CORRUPT", "MESSAGE_NOT_FOUND")
            [after] = client.send("c", [{"body": b"after the flips"}], queue_id=0)
            assert after["commit_log_offset"] >= log_end, "records after the damage were cut"
    finally:
        assert engine.stop() == 0
    findings = check_store(store_dir, small_config())
    assert findings, "check must report the damage"
    assert {f.area for f in findings} <= {"commitlog", "consumequeue"}


@pytest.mark.slow
def test_a_flip_in_the_record_crc_property_never_serves_wrong_bytes(store_dir: Path) -> None:
    producer = populate(store_dir, batches=10)
    record = all_records(store_dir)[5]
    for byte in range(record.total_size - 20, record.total_size):
        path, pos = segment_path(store_dir, record.commit_log_offset + byte)
        flip_bit(path, pos, byte % 8)
        engine = EngineProcess(store_dir, config=small_config())
        engine.start()
        try:
            with engine.client() as client:
                verdict = verify([producer], read_everything(client, TOPICS))
                assert not verdict.corrupt and not verdict.misplaced
        finally:
            assert engine.stop() == 0
        flip_bit(path, pos, byte % 8)  # undo, for the next byte
        if byte > record.total_size - 17:
            break  # the name, the separator and digits are each covered; the rest repeats them


# -- queue units, index, checkpoint ----------------------------------------------------------

def test_bit_flips_in_queue_units_are_never_served_and_units_are_rebuilt(store_dir: Path) -> None:
    producer = populate(store_dir)
    rng = random.Random(4)
    flipped = 0
    for topic, queue_id in list_queues(store_dir):
        cq = ConsumeQueue(store_dir, topic, queue_id, file_units=small_config().consume_queue_file_units,
                          writable=False)
        count = cq.max_offset
        files = list_files(cq.files.directory)
        cq.close()
        for queue_offset in [*rng.sample(range(count), 6), count - 1]:
            byte = queue_offset * CQ_UNIT_BYTES
            start, path = [(s, p) for s, p in files if s <= byte][-1]
            flip_bit(path, byte - start + rng.randrange(CQ_UNIT_BYTES), rng.randrange(8))
            flipped += 1
    engine = EngineProcess(store_dir, config=small_config())
    engine.start()
    try:
        with engine.client() as client:
            verdict = verify([producer], read_everything(client, TOPICS))
        assert verdict.ok(), verdict.summary()
    finally:
        assert engine.stop() == 0
    assert flipped >= 18
    findings = check_store(store_dir, small_config())
    assert findings == [], "\n".join(map(str, findings))


def test_index_damage_is_found_by_check_queries_stay_correct_and_repair_rebuilds(store_dir: Path) -> None:
    producer = populate(store_dir)
    index_dir = store_dir / "index"
    rng = random.Random(6)
    config = small_config()
    items_base = 40 + config.index_hash_slot_count * 4
    for path in sorted(index_dir.iterdir())[:2]:
        for item in rng.sample(range(1, 200), 10):
            flip_bit(path, items_base + item * 20 + 4 + rng.randrange(8), rng.randrange(8))  # the offset field
    assert any(f.area == "index" for f in check_store(store_dir, config))
    engine = EngineProcess(store_dir, config=config)
    engine.start()
    try:
        with engine.client() as client:
            for message_id in rng.sample(sorted(producer.acked), 40):
                for found in client.query_by_key("c", f"{message_id[0]}-{message_id[1]}"):
                    assert parse_body(found["body"]) == message_id, "a query returned a wrong message"
    finally:
        assert engine.stop() == 0
    report = rebuild_derived(store_dir, config)
    assert report.records == len(producer.acked)
    assert check_store(store_dir, config) == []
    engine.start()
    try:
        with engine.client() as client:
            for message_id in sorted(producer.acked)[::7]:
                [found] = client.query_by_key("c", f"{message_id[0]}-{message_id[1]}")
                assert parse_body(found["body"]) == message_id
            assert verify([producer], read_everything(client, TOPICS)).ok()
    finally:
        assert engine.stop() == 0


def assert_served_intact(store_dir: Path, producer: Producer, *, send_more: bool = False) -> None:
    """Start the engine on the store, read every queue back and check every message, stop it."""
    engine = EngineProcess(store_dir, config=small_config())
    engine.start()
    try:
        with engine.client() as client:
            wait_dispatched(client)
            assert verify([producer], read_everything(client, TOPICS)).ok()
            if send_more:
                client.send("c", [{"body": b"more"}])
    finally:
        assert engine.stop() == 0


@pytest.mark.parametrize("where", [*(pytest.param(w, marks=pytest.mark.slow) for w in (0, 33, 4080)), 17, 4064])
def test_a_damaged_checkpoint_means_a_full_scan_not_a_loss(store_dir: Path, where: int) -> None:
    producer = populate(store_dir, batches=20)
    flip_bit(store_dir / "checkpoint", where, 3)
    assert_served_intact(store_dir, producer, send_more=True)
    assert check_store(store_dir, small_config()) == []


def test_a_deleted_queue_directory_is_reported_by_check_and_rebuilt_by_repair(store_dir: Path) -> None:
    producer = populate(store_dir, batches=20)
    shutil.rmtree(store_dir / "consumequeue" / "c" / "1")
    findings = check_store(store_dir, small_config())
    assert [(f.area, f.where) for f in findings] == [("consumequeue", "c/1")]
    rebuild_derived(store_dir, small_config())
    assert check_store(store_dir, small_config()) == []
    assert_served_intact(store_dir, producer)


def test_a_record_whose_length_field_is_damaged_is_corrupt_by_id_and_by_offset(store_dir: Path) -> None:
    """A record in the middle of the log with a length field that disagrees with its size is a
    damaged record (MESSAGE_CORRUPT), not a missing one; an offset inside a record stays not found."""
    engine = EngineProcess(store_dir, config=small_config())
    engine.start()
    try:
        with engine.client() as client:
            stored = client.send("c", [{"body": b"m" * 100} for _ in range(3)], queue_id=0)
    finally:
        assert engine.stop() == 0
    middle = stored[1]
    path, pos = segment_path(store_dir, middle["commit_log_offset"])
    proplen_at = 84 + 4 + 100 + 1 + 1  # header, BODYLEN, the body, TOPICLEN and the topic "c"
    flip_bit(path, pos + proplen_at + 1, 0)  # PROPLEN one off: "length fields disagree with total size"

    engine = EngineProcess(store_dir, config=small_config())
    engine.start()
    try:
        with engine.client() as client:
            for read in (lambda: client.get_by_offset(middle["commit_log_offset"]),
                         lambda: client.get_by_id(middle["msg_id"])):
                with pytest.raises(EngineError) as info:
                    read()
                assert info.value.name == "MESSAGE_CORRUPT", info.value
            with pytest.raises(EngineError) as info:
                client.get_by_offset(middle["commit_log_offset"] + 1)
            assert info.value.name == "MESSAGE_NOT_FOUND"
            assert client.get_by_id(stored[2]["msg_id"])["body"] == b"m" * 100
    finally:
        assert engine.stop() == 0
