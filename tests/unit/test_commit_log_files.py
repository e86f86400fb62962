"""CommitLog segments, blank markers, recovery planning and ConsumeQueue files,
on real files in tmp_path (reference sections 1.2, 2.1, 3.1).
"""

from __future__ import annotations

import os
import random
import struct
from dataclasses import dataclass, field

import pytest

from engine.config import ConfigError, StoreConfig
from engine.layout import (
    CQ_UNIT_BYTES,
    HostAddress,
    Record,
    RecordFields,
    encode_properties,
    encode_record,
    offset_to_file_name,
    tags_code,
)
from engine.services.recovery import plan_commit_log_recovery
from engine.store.checkpoint import Checkpoint, store_checkpoint
from engine.store.commit_log import COMMIT_LOG_DIR, CommitLogReader, CommitLogWriter, Damage
from engine.store.consume_queue import BLANK_UNIT_SIZE, ConsumeQueue, queue_dir
from harness.simulation.disk import SimDisk

pytestmark = pytest.mark.timeout(30)

SEG = 64 * 1024
MAGIC_BLANK = 0xCBD43194
STORE_HOST = HostAddress.parse("127.0.0.1", 10911)
BORN_HOST = HostAddress.parse("10.0.0.1", 51234)
QUEUES = [("TopicA", 0), ("TopicA", 1), ("TopicB", 0)]
T0 = 1_700_000_000_000


@dataclass
class Appended:
    offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    fields: RecordFields
    store_ts: int


@dataclass
class Log:
    writer: CommitLogWriter
    records: list[Appended] = field(default_factory=list)
    rolls: list[tuple[int, int]] = field(default_factory=list)  # (old write position, remaining bytes)
    next_queue_offsets: dict[tuple[str, int], int] = field(default_factory=dict)


def build_log(store_dir, *, min_segments: int = 3, seed: int = 1234) -> Log:
    writer = CommitLogWriter(store_dir, SEG, store_host=STORE_HOST, with_record_crc=True)
    log = Log(writer)
    rng = random.Random(seed)
    batch_no = 0
    while writer.written_offset < (min_segments - 1) * SEG + 4096:
        topic, queue_id = QUEUES[batch_no % len(QUEUES)]
        key = (topic, queue_id)
        first = log.next_queue_offsets.get(key, 0)
        batch = []
        for i in range(rng.randint(1, 5)):
            n = len(log.records) + len(batch)
            body = bytes((n + j) % 251 for j in range(rng.randint(100, 1500)))
            props = encode_properties({"TAGS": f"Tag{n % 3}", "KEYS": f"key{n}", "UNIQ_KEY": f"{n:032X}"})
            batch.append(RecordFields(topic.encode(), queue_id, body, props, flag=i, born_timestamp_ms=T0 + n,
                                      born_host=BORN_HOST))
        old = writer.written_offset
        remaining = SEG - old % SEG
        total = writer.batch_size(batch)
        store_ts = T0 + 10_000 + batch_no
        result = writer.append(batch, first_queue_offset=first, store_timestamp_ms=store_ts)
        if total + 8 > remaining:
            log.rolls.append((old, remaining))
            assert result.positions[0][0] == old + remaining  # the batch starts the next segment
        else:
            assert result.positions[0][0] == old
        for i, ((offset, size), fields) in enumerate(zip(result.positions, batch, strict=True)):
            log.records.append(Appended(offset, size, topic, queue_id, first + i, fields, store_ts))
        assert result.end_offset == writer.written_offset
        log.next_queue_offsets[key] = first + len(batch)
        batch_no += 1
    return log


@pytest.fixture
def log(tmp_path):
    built = build_log(tmp_path)
    yield built
    built.writer.close()


def recovery_config() -> StoreConfig:
    # StoreConfig.validate demands message_body_bytes_max + 64 KiB <= segment_size_bytes, so with
    # 64 KiB segments the only bodies limit it accepts is 0 (1024 is refused, see the test below).
    return StoreConfig.test_min().replace(segment_size_bytes=SEG, message_body_bytes_max=1024)


def segment_path(store_dir, start: int):
    return store_dir / COMMIT_LOG_DIR / f"{start:020d}"


def patch_file(store_dir, offset: int, data: bytes) -> None:
    start = offset - offset % SEG
    with open(segment_path(store_dir, start), "r+b") as f:
        f.seek(offset - start)
        f.write(data)


# --- segments and blank markers ----------------------------------------------------

def test_segments_are_named_by_start_offset_and_full_size(tmp_path, log):
    names = sorted(os.listdir(tmp_path / COMMIT_LOG_DIR))
    count = log.writer.written_offset // SEG + 1
    assert count >= 3
    assert names == [f"{i * SEG:020d}" for i in range(count)]
    assert names[1] == "00000000000000065536"
    for name in names:
        assert os.path.getsize(tmp_path / COMMIT_LOG_DIR / name) == 65536


def test_blank_marker_where_a_batch_did_not_fit(tmp_path, log):
    assert len(log.rolls) >= 2
    for old, remaining in log.rolls:
        start = old - old % SEG
        assert start + SEG - old == remaining
        raw = segment_path(tmp_path, start).read_bytes()
        pos = old - start
        # [TOTALSIZE = bytes left in the file][BLANK magic], big-endian
        assert raw[pos:pos + 8] == struct.pack(">i", remaining) + bytes.fromhex("CBD43194")
        assert raw[pos:pos + 8] == struct.pack(">iI", remaining, MAGIC_BLANK)
        # the last record of the old segment ends exactly at the marker
        last = max((r for r in log.records if start <= r.offset < old), key=lambda r: r.offset)
        assert last.offset + last.size == old


def test_records_on_disk_are_the_encoded_bytes(tmp_path, log):
    for rec in log.records:
        start = rec.offset - rec.offset % SEG
        raw = segment_path(tmp_path, start).read_bytes()
        expected = encode_record(rec.fields, queue_offset=rec.queue_offset, commit_log_offset=rec.offset,
                                 store_timestamp_ms=rec.store_ts, store_host=STORE_HOST, with_record_crc=True)
        assert len(expected) == rec.size
        assert raw[rec.offset - start:rec.offset - start + rec.size] == expected
        # PHYSICALOFFSET (position 28) is the record's own absolute offset
        assert struct.unpack_from(">q", raw, rec.offset - start + 28)[0] == rec.offset


def test_scan_yields_every_record_in_order(tmp_path, log):
    reader = CommitLogReader(tmp_path, 65536)
    items = list(reader.scan(0, log.writer.written_offset, check_crc=True))
    assert not [item for item in items if isinstance(item, Damage)]
    assert all(isinstance(item, Record) for item in items)
    assert len(items) == len(log.records)
    for item, rec in zip(items, log.records, strict=True):
        assert item.commit_log_offset == rec.offset
        assert item.total_size == rec.size
        assert item.topic == rec.topic and item.queue_id == rec.queue_id
        assert item.queue_offset == rec.queue_offset
        assert bytes(item.body) == bytes(rec.fields.body)
        assert item.store_timestamp_ms == rec.store_ts
        assert item.store_host == STORE_HOST and item.born_host == BORN_HOST
    # queue offsets are dense per queue
    per_queue: dict[tuple[str, int], list[int]] = {}
    for item in items:
        per_queue.setdefault((item.topic, item.queue_id), []).append(item.queue_offset)
    for offsets in per_queue.values():
        assert offsets == list(range(len(offsets)))
    # read() by offset agrees with scan()
    middle = log.records[len(log.records) // 2]
    assert reader.read(middle.offset, limit=log.writer.written_offset).queue_offset == middle.queue_offset
    del items
    reader.segments.close()


# --- recovery planning -----------------------------------------------------------------

def test_config_refuses_a_segment_too_small_for_the_largest_record():
    with pytest.raises(ConfigError):
        StoreConfig.test_min().replace(segment_size_bytes=SEG, message_body_bytes_max=SEG)
    with pytest.raises(ConfigError):
        StoreConfig.test_min().replace(message_body_bytes_max=0)
    assert recovery_config().segment_size_bytes == SEG


def test_plan_finds_the_end_and_next_queue_offsets(tmp_path, log):
    plan = plan_commit_log_recovery(tmp_path, recovery_config())
    assert plan.end_offset == log.writer.written_offset
    assert plan.min_offset == 0
    assert plan.scan_start == 0
    assert plan.damage == []
    assert plan.records_scanned == len(log.records)
    assert plan.next_queue_offsets == log.next_queue_offsets
    assert plan.last_store_timestamp_ms == log.records[-1].store_ts


def test_plan_ignores_garbage_after_the_last_record(tmp_path, log):
    end = log.writer.written_offset
    room = SEG - end % SEG
    garbage = random.Random(99).randbytes(min(4096, room))
    patch_file(tmp_path, end, garbage)
    plan = plan_commit_log_recovery(tmp_path, recovery_config())
    assert plan.end_offset == end
    assert plan.damage == []
    assert plan.records_scanned == len(log.records)
    assert plan.next_queue_offsets == log.next_queue_offsets


def test_plan_ignores_a_torn_record_at_the_tail(tmp_path, log):
    end = log.writer.written_offset
    last = log.records[-1]
    torn = encode_record(last.fields, queue_offset=last.queue_offset + 1, commit_log_offset=end,
                         store_timestamp_ms=last.store_ts + 1, store_host=STORE_HOST, with_record_crc=True)
    patch_file(tmp_path, end, torn[:len(torn) // 2])  # only half of it reached the disk
    plan = plan_commit_log_recovery(tmp_path, recovery_config())
    assert plan.end_offset == end
    assert plan.damage == []
    assert plan.next_queue_offsets == log.next_queue_offsets


def _middle_record(log: Log) -> int:
    """Index of a record inside segment 1, not last in its segment, with later records in its queue."""
    for i, rec in enumerate(log.records[1:-1], start=1):
        nxt = log.records[i + 1]
        if rec.offset // SEG == 1 and nxt.offset // SEG == 1 and rec.offset % SEG > 0 \
                and rec.queue_offset + 1 < log.next_queue_offsets[(rec.topic, rec.queue_id)]:
            return i
    raise AssertionError("no suitable middle record")


def test_plan_skips_one_damaged_middle_record(tmp_path, log):
    i = _middle_record(log)
    damaged, following = log.records[i], log.records[i + 1]
    assert following.offset == damaged.offset + damaged.size
    patch_file(tmp_path, damaged.offset + 84 + 4 + 5, b"\xFF")  # a byte inside BODY
    plan = plan_commit_log_recovery(tmp_path, recovery_config())
    assert plan.end_offset == log.writer.written_offset
    [damage] = plan.damage
    assert (damage.start, damage.end) == (damaged.offset, following.offset)
    assert "CRC mismatch" in damage.reason  # the record CRC covers the body too
    assert plan.records_scanned == len(log.records) - 1
    assert plan.next_queue_offsets == log.next_queue_offsets

    reader = CommitLogReader(tmp_path, SEG)
    items = list(reader.scan(0, log.writer.written_offset, check_crc=True))
    assert [(x.start, x.end) for x in items if isinstance(x, Damage)] == [(d.start, d.end) for d in plan.damage]
    kept = [x.commit_log_offset for x in items if isinstance(x, Record)]
    assert kept == [r.offset for r in log.records if r is not damaged]
    del items
    reader.segments.close()


def test_plan_skips_a_damaged_header_byte(tmp_path, log):
    i = _middle_record(log)
    damaged, following = log.records[i], log.records[i + 1]
    patch_file(tmp_path, damaged.offset + 15, b"\x7F")  # QUEUEID: only the record CRC sees it
    plan = plan_commit_log_recovery(tmp_path, recovery_config())
    assert plan.end_offset == log.writer.written_offset
    assert plan.damage == [Damage(damaged.offset, following.offset, "record CRC mismatch")]
    assert plan.next_queue_offsets == log.next_queue_offsets


def test_plan_skips_a_damaged_last_record_before_a_blank_marker(tmp_path, log):
    old, remaining = log.rolls[0]
    last = max((r for r in log.records if r.offset < old), key=lambda r: r.offset)
    patch_file(tmp_path, last.offset + 84 + 4 + 1, b"\x00\x00")
    plan = plan_commit_log_recovery(tmp_path, recovery_config())
    assert plan.end_offset == log.writer.written_offset
    assert len(plan.damage) == 1
    assert plan.damage[0].start == last.offset
    # the damage runs to the blank marker or over it to the segment end; either way the next
    # segment's records are kept
    assert plan.damage[0].end in (old, old + remaining)
    assert plan.records_scanned == len(log.records) - 1


# --- ConsumeQueue files --------------------------------------------------------------

def unit_bytes(commit_log_offset: int, size: int, tags: int) -> bytes:
    # commitLogOffset int64 | msgSize int32 | tagsCode int64, big-endian
    return struct.pack(">q", commit_log_offset) + struct.pack(">i", size) + struct.pack(">q", tags)


def test_plan_does_not_count_lost_units_of_a_queue_that_outlived_the_log(tmp_path, log):
    """A power cut took the log's tail and, in the queue, a page of units (zeros) before units that
    point past the log's new end. The zeroed units are not below the end: counting them would give
    new records queue offsets past a gap, which the owners then fill with holes (MESSAGE_CORRUPT)."""
    key = ("TopicA", 0)
    ours = [r for r in log.records if (r.topic, r.queue_id) == key]
    n = log.next_queue_offsets[key]
    cq = ConsumeQueue(tmp_path, *key, file_units=recovery_config().consume_queue_file_units, writable=True)
    for r in ours:
        cq.put(r.queue_offset, r.offset, r.size, 0)
    end = log.writer.written_offset
    for i in range(n, 3 * n):  # units of records the cut took from the log
        cq.put(i, end + (i - n) * 1000, 1000, 0)
    for i in range(n // 2, 2 * n):  # a lost page: zeros, below and past the end
        cq.files.find(i * CQ_UNIT_BYTES).mm[i * CQ_UNIT_BYTES:(i + 1) * CQ_UNIT_BYTES] = bytes(CQ_UNIT_BYTES)
    cq.flush()
    cq.close()
    plan = plan_commit_log_recovery(tmp_path, recovery_config())
    assert plan.end_offset == end
    assert plan.next_queue_offsets[key] == n


def test_consume_queue_files_and_reopen(tmp_path):
    tag = tags_code("TagA")
    cq = ConsumeQueue(tmp_path, "TopicTest", 0, file_units=4, writable=True)
    assert (cq.min_offset, cq.max_offset, cq.max_physical_end) == (0, 0, 0)
    units = [(1000 + i * 200, 177, tag if i % 2 == 0 else -5) for i in range(6)]
    for i, unit in enumerate(units):
        assert cq.put(i, *unit)
    cq.flush()
    cq.close()

    directory = queue_dir(tmp_path, "TopicTest", 0)
    assert directory == tmp_path / "consumequeue" / "TopicTest" / "0"
    # files of 4 units (80 bytes) named by logical byte offset = queue offset * 20
    assert sorted(os.listdir(directory)) == ["00000000000000000000", "00000000000000000080"]
    first = (directory / "00000000000000000000").read_bytes()
    second = (directory / "00000000000000000080").read_bytes()
    assert first == b"".join(unit_bytes(*u) for u in units[:4])
    assert second == b"".join(unit_bytes(*u) for u in units[4:]) + bytes(40)
    assert first[:20] == bytes.fromhex("00000000000003E8" "000000B1" "000000000027A807")
    assert first[32:40] == bytes.fromhex("FFFFFFFFFFFFFFFB")  # tagsCode -5

    again = ConsumeQueue(tmp_path, "TopicTest", 0, file_units=4, writable=False)
    assert again.min_offset == 0
    assert again.max_offset == 6
    assert again.max_physical_end == 1000 + 5 * 200 + 177
    assert [tuple(again.get(i)) for i in range(6)] == units
    assert again.get(6) is None
    assert [tuple(u) for u in again.read(2, 10)] == units[2:4]  # a read stays within one file
    assert [tuple(u) for u in again.read(4, 10)] == units[4:6]
    again.close()


def test_consume_queue_put_is_idempotent(tmp_path):
    cq = ConsumeQueue(tmp_path, "TopicTest", 1, file_units=4, writable=True)
    assert cq.put(0, 100, 50, 1)
    assert cq.put(1, 150, 50, 2)
    assert not cq.put(1, 150, 50, 2)   # replay of the last unit
    assert not cq.put(0, 100, 50, 1)   # replay of an older unit
    assert not cq.put(2, 120, 30, 3)   # ends at or below max_physical_end
    assert cq.max_offset == 2 and cq.max_physical_end == 200
    cq.close()

    reopened = ConsumeQueue(tmp_path, "TopicTest", 1, file_units=4, writable=True)
    assert (reopened.max_offset, reopened.max_physical_end) == (2, 200)
    assert not reopened.put(1, 150, 50, 2)  # still a replay after a restart
    assert reopened.put(2, 200, 50, 3)
    reopened.close()
    raw = (queue_dir(tmp_path, "TopicTest", 1) / "00000000000000000000").read_bytes()
    assert raw == unit_bytes(100, 50, 1) + unit_bytes(150, 50, 2) + unit_bytes(200, 50, 3) + bytes(20)


def test_consume_queue_gap_gets_blank_units_and_files_roll(tmp_path):
    cq = ConsumeQueue(tmp_path, "TopicGap", 2, file_units=4, writable=True)
    assert cq.put(0, 0, 100, 7)
    assert cq.put(1, 100, 100, 7)
    # queue offsets 2..8 were never dispatched (damaged records): blank units fill the gap
    assert cq.put(9, 5000, 100, 7)
    assert cq.max_offset == 10
    cq.close()

    directory = queue_dir(tmp_path, "TopicGap", 2)
    # queue offset 9 -> byte 180 -> third file "...160"
    assert sorted(os.listdir(directory)) == ["00000000000000000000", "00000000000000000080",
                                             "00000000000000000160"]
    blank = unit_bytes(0, 0x7FFFFFFF, 0)
    assert blank == bytes.fromhex("0000000000000000" "7FFFFFFF" "0000000000000000")
    assert BLANK_UNIT_SIZE == 0x7FFFFFFF
    assert (directory / "00000000000000000000").read_bytes() == \
        unit_bytes(0, 100, 7) + unit_bytes(100, 100, 7) + blank + blank
    assert (directory / "00000000000000000080").read_bytes() == blank * 4
    assert (directory / "00000000000000000160").read_bytes() == blank + unit_bytes(5000, 100, 7) + bytes(40)

    again = ConsumeQueue(tmp_path, "TopicGap", 2, file_units=4, writable=False)
    assert again.max_offset == 10
    assert again.max_physical_end == 5100
    assert again.get(5).is_blank and not again.get(9).is_blank
    again.close()


def test_consume_queue_file_names_with_realistic_unit_counts(tmp_path):
    cq = ConsumeQueue(tmp_path, "TopicBig", 0, file_units=1000, writable=True)
    for i in range(1001):
        assert cq.put(i, i * 100, 100, 0)
    cq.close()
    names = sorted(os.listdir(queue_dir(tmp_path, "TopicBig", 0)))
    # 1000 units x 20 bytes: the second file starts at logical byte 20000
    assert names == ["00000000000000000000", "00000000000000020000"]
    raw = (queue_dir(tmp_path, "TopicBig", 0) / "00000000000000020000").read_bytes()
    assert len(raw) == 20000
    assert raw[:20] == unit_bytes(100_000, 100, 0)


def test_the_next_segment_is_preallocated_in_the_background_and_a_roll_uses_it(tmp_path) -> None:
    writer = CommitLogWriter(tmp_path, SEG, store_host=STORE_HOST, with_record_crc=True, warm_segments=True)
    writer.ensure_segment()
    segment_dir = tmp_path / COMMIT_LOG_DIR
    assert sorted(os.listdir(segment_dir)) == [f"{0:020d}"]
    writer.ensure_next_segment()
    writer.ensure_next_segment()  # one preallocation at a time: a second call while it runs is a no-op
    fields = RecordFields(b"TopicA", 0, b"x" * 1000, encode_properties({"KEYS": "k"}), 0, T0, BORN_HOST)
    batch = [fields] * 10
    queue_offset = 0
    while writer.written_offset < SEG:
        writer.append(batch, first_queue_offset=queue_offset, store_timestamp_ms=T0)
        queue_offset += len(batch)
    assert sorted(os.listdir(segment_dir)) == [f"{0:020d}", f"{SEG:020d}"]
    assert (segment_dir / f"{SEG:020d}").stat().st_size == SEG
    writer.close()
    reader = CommitLogReader(tmp_path, SEG)
    records = list(reader.scan(0, writer.written_offset, check_crc=True))
    assert all(not isinstance(item, Damage) for item in records)
    assert [r.queue_offset for r in records] == list(range(queue_offset))
    reader.segments.close()


def test_appends_do_not_wait_for_a_preallocation_in_progress(tmp_path) -> None:
    big = 256 * 1024 * 1024  # zeroing and syncing a warm segment this size takes well over 0.1 s
    writer = CommitLogWriter(tmp_path, big, store_host=STORE_HOST, with_record_crc=True, warm_segments=True)
    writer.ensure_segment()
    writer.ensure_next_segment()
    fields = RecordFields(b"TopicA", 0, b"x" * 100, encode_properties({"KEYS": "k"}), 0, T0, BORN_HOST)
    writer.append([fields], first_queue_offset=0, store_timestamp_ms=T0)
    assert writer._preallocation is not None and writer._preallocation.is_alive()  # the append did not wait
    writer.close()  # waits for it
    assert (tmp_path / COMMIT_LOG_DIR / f"{big:020d}").stat().st_size == big
    for segment in (tmp_path / COMMIT_LOG_DIR).iterdir():  # 512 MiB: not left for pytest's kept tmp dirs
        segment.unlink()


def test_a_queue_ends_at_its_last_unit_when_a_later_file_holds_none(tmp_path, log):
    """A power cut keeps a new queue file (its creation is synced) and loses its units, and the
    owner's recovery zeroes the units past the durable point: the queue ends after its last
    unit, not at the empty file, or the writer's next recovery skips the queue offsets between
    (seed 138 of the simulation: units 62 and 63 zero, records from 64 on)."""
    records = [r for r in log.records if (r.topic, r.queue_id) == ("TopicA", 0)]
    cq = ConsumeQueue(tmp_path, "TopicA", 0, file_units=4, writable=True)
    for r in records:
        assert cq.put(r.queue_offset, r.offset, r.size, 0)
    end = log.writer.written_offset
    boundary = (len(records) // 4 + 1) * 4  # the first unit of a new file
    for lost in range(len(records), boundary + 1):  # units of records the cut took
        assert cq.put(lost, end + lost * 100, 100, 0)
    cq.take_unsynced()
    cq.truncate_from(len(records))  # as the owner's recovery drops them
    # The files it zeroed are flushed with the next units: the units dropped may be on disk.
    zeroed = {len(records) * 20 - len(records) * 20 % 80, boundary * 20}
    assert cq.take_unsynced() == [cq.files.directory / offset_to_file_name(start) for start in sorted(zeroed)]
    cq.close()
    store_checkpoint(tmp_path, Checkpoint(flushed_offset=end, dispatched_offset=end))

    again = ConsumeQueue(tmp_path, "TopicA", 0, file_units=4, writable=False)
    assert (again.max_offset, again.max_physical_end) == (len(records), records[-1].offset + records[-1].size)
    again.close()
    plan = plan_commit_log_recovery(tmp_path, recovery_config().replace(consume_queue_file_units=4))
    assert plan.next_queue_offsets[("TopicA", 0)] == len(records)


def test_recovery_makes_the_bytes_it_zeroes_past_the_end_durable(tmp_path, log):
    """A record past the recovered end (on disk: the power cut left it, or a killed writer's
    torn batch was synced with its segment) is zeroed by the writer's recovery, and the zeroes
    must reach the disk: with nothing appended after, no flush covers them, and a power cut
    after the next clean stop brought the record back (seed 592 of the simulation)."""
    end = log.writer.written_offset
    last = log.records[-1]
    stale = encode_record(last.fields, queue_offset=last.queue_offset + 1, commit_log_offset=end + 512,
                          store_timestamp_ms=last.store_ts + 1, store_host=STORE_HOST, with_record_crc=True)
    patch_file(tmp_path, end + 512, stale)
    with SimDisk(tmp_path) as disk:
        for start in log.writer.segments.known:
            disk.on_sync(segment_path(tmp_path, start), 0, None)  # all of it on disk, the stale record too
        writer = CommitLogWriter(tmp_path, SEG, store_host=STORE_HOST, with_record_crc=True)
        writer.open_at(end, after_power_loss=True)
        writer.close()
        disk.power_cut(random.Random(1), written_back_ratio=0.0)  # nothing unsynced survives
    start = end - end % SEG
    assert not segment_path(tmp_path, start).read_bytes()[end - start:].strip(b"\x00")
    plan = plan_commit_log_recovery(tmp_path, recovery_config())
    assert (plan.end_offset, plan.damage) == (end, [])
