"""Catch-up slices and the look for moves, against a record-by-record decode of the same log.

Slices of every size (down to one byte: a record across a slice's end is read whole), over
segments that roll with blank markers and a damaged record in the middle, give the entries
and moves of one pass in Python, each once.
"""

from __future__ import annotations

import pytest

from engine import codec
from engine.layout import Record, RecordFields, encode_properties
from engine.services.log_slices import read_slice
from engine.services.moved_records import MoveSearch
from engine.store.commit_log import CommitLogReader, CommitLogWriter, Damage
from engine.store.system_topics import HALF_TOPIC, PROPERTY_ORIGIN_OFFSET, SYSTEM_TOPICS, origin_offset
from tests.unit.test_commit_log_files import BORN_HOST, SEG, STORE_HOST, T0, patch_file

pytestmark = pytest.mark.timeout(30)
OWNERS = 3
TOPICS = [("orders", 0), ("orders", 1), ("audit", 0), (HALF_TOPIC, 0)]


def write_log(store_dir) -> tuple[int, list[int]]:
    """Four segments of batches: some records are moves (``ORIGIN_OFFSET``), some bodies hold the
    property's name, and a system topic's records carry it too (they are not moves).
    Returns the log's end and every record's offset."""
    writer = CommitLogWriter(store_dir, SEG, store_host=STORE_HOST, with_record_crc=True)
    offsets: list[int] = []
    next_offset: dict[tuple[str, int], int] = {}
    n = 0
    while writer.written_offset < 3 * SEG + 4096:
        topic, queue_id = TOPICS[n % len(TOPICS)]
        batch = []
        for i in range(1 + n % 4):
            k = n + i
            properties = {"TAGS": f"Tag{k % 3}", "KEYS": f"key{k}"} if k % 2 else {"UNIQ_KEY": f"{k:032X}"}
            if k % 5 == 0:
                properties[PROPERTY_ORIGIN_OFFSET] = str(1_000_000 + k)
            body = f"{PROPERTY_ORIGIN_OFFSET}\x01{k}\x02".encode() if k % 11 == 0 else bytes(100 + (k * 37) % 1400)
            batch.append(RecordFields(topic.encode(), queue_id, body, encode_properties(properties), flag=0,
                                      born_timestamp_ms=T0 + k, born_host=BORN_HOST))
        first = next_offset.get((topic, queue_id), 0)
        result = writer.append(batch, first_queue_offset=first, store_timestamp_ms=T0 + n)
        offsets += [offset for offset, _size in result.positions]
        next_offset[(topic, queue_id)] = first + len(batch)
        n += len(batch)
    end = writer.written_offset
    writer.close()
    return end, offsets


def reference(reader: CommitLogReader, end: int) -> tuple[list[list[tuple]], list[tuple], set[int]]:
    per_owner: list[list[tuple]] = [[] for _ in range(OWNERS)]
    for_index, moved = [], set()
    for item in reader.scan(0, end):
        if isinstance(item, Damage):
            continue
        assert isinstance(item, Record)
        entry = (item.topic, item.queue_id, item.queue_offset, item.commit_log_offset, item.total_size,
                 codec.tags_code(item.tags), item.store_timestamp_ms, [])
        per_owner[codec.owner_index(item.topic, item.queue_id, OWNERS)].append(entry)
        keys = [item.uniq_key, *item.keys] if item.uniq_key else item.keys
        if keys:
            for_index.append((*entry[:7], keys))
        if item.topic not in SYSTEM_TOPICS and origin_offset(item) is not None:
            moved.add(origin_offset(item))
    return per_owner, for_index, moved


@pytest.mark.parametrize("bytes_max", [1, 700, 5_000, SEG, 1 << 30])
def test_slices_of_any_size_read_every_record_once(tmp_path, bytes_max: int) -> None:
    end, offsets = write_log(tmp_path)
    damaged = offsets[len(offsets) // 2]
    patch_file(tmp_path, damaged + 4, b"\x00\x00\x00\x00")  # its magic: the codec stops there
    reader = CommitLogReader(tmp_path, SEG)
    per_owner, for_index, moved = reference(reader, end)
    assert moved and sum(map(len, per_owner)) == len(offsets) - 1

    got: list[list[tuple]] = [[] for _ in range(OWNERS)]
    got_index: list[tuple] = []
    offset = 0
    while offset < end:
        piece = read_slice(reader, offset, end, bytes_max, OWNERS)
        assert piece.end > offset
        for mine, entries in zip(got, piece.per_owner, strict=True):
            mine.extend(entries)
        got_index += piece.for_index
        offset = piece.end
    assert offset == end
    assert got == per_owner and got_index == for_index

    search = MoveSearch(reader, 0, end)
    while not search.done:
        search.step(bytes_max)
    assert search.found == moved
