"""A master's chunks (``LogShipping``) and a replica's appends of them (``LogAppends.append_replicated``),
over real segment files: shipped chunk by chunk, a log arrives byte for byte with its queue counters;
a chunk is whole records, never past the confirmed end nor across a segment's end; a chunk that
is not for the replica's end is refused and changes nothing; reports the master cannot follow
are refused with the reason."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.config import KiB, StoreConfig
from engine.ipc.channels import REPLICATION
from engine.ipc.wire import Origin
from engine.layout import HostAddress, RecordFields, encode_properties
from engine.services.replication.log_shipping import LogShipping
from engine.services.writer.log_appends import LogAppends
from engine.store.commit_log import CommitLogWriter
from engine.store.deleted_topics import table_crc
from engine.store.records import UniqKeys
from harness.replication import log_bytes

pytestmark = pytest.mark.timeout(60)

HOST = HostAddress.parse("127.0.0.1", 10911)
NO_DELETIONS = table_crc({})
CONFIG = StoreConfig.test_min().replace(segment_size_bytes=256 * KiB, message_body_bytes_max=96 * KiB,
                                        send_batch_bytes_max=200 * KiB, replication_chunk_bytes_max=64 * KiB,
                                        replication_chunks_in_flight_max=3)


def write_master(store_dir: Path, rng: random.Random, batches: int) -> tuple[int, dict[tuple[str, int], int]]:
    writer = CommitLogWriter(store_dir, CONFIG.segment_size_bytes, store_host=HOST, with_record_crc=True)
    queues: dict[tuple[str, int], int] = {}
    try:
        for n in range(batches):
            topic, queue_id = rng.choice([("a", 0), ("a", 1), ("b", 0)])
            size = rng.choice([10, 3_000, 70 * KiB])  # some records larger than a chunk
            batch = [RecordFields(topic.encode(), queue_id, rng.randbytes(size), encode_properties({"KEYS": f"k{n}"}),
                                  flag=0, born_timestamp_ms=1_000 + n, born_host=HOST)
                     for _ in range(rng.randint(1, 2 if size > KiB else 20))]
            first = queues.get((topic, queue_id), 0)
            writer.append(batch, first_queue_offset=first, store_timestamp_ms=2_000 + n)
            queues[(topic, queue_id)] = first + len(batch)
        return writer.written_offset, queues
    finally:
        writer.close()


def append(appends: LogAppends, offset: int, data: bytes) -> str:
    """A replica's append with no topic deleted on either side."""
    return appends.append_replicated(offset, data, deletions_crc=NO_DELETIONS, own_deletions_crc=NO_DELETIONS)


def replica_appends(store_dir: Path) -> LogAppends:
    writer = CommitLogWriter(store_dir, CONFIG.segment_size_bytes, store_host=HOST, with_record_crc=True)
    return LogAppends(writer, store_dir, CONFIG, store_host=HOST, uniq_keys=UniqKeys(HOST, 1))


def test_a_log_shipped_chunk_by_chunk_arrives_byte_for_byte(tmp_path: Path) -> None:
    end, queues = write_master(tmp_path / "master", random.Random(4), 120)
    assert end > 3 * CONFIG.segment_size_bytes  # segments rolled, blank tails among the chunks
    shipping = LogShipping(tmp_path / "master", CONFIG)
    origin = Origin(REPLICATION, b"r1")
    replica = shipping.report(origin, 0, restart=True, confirmed=end, min_offset=0, now_ms=0)
    assert not isinstance(replica, str)
    appends = replica_appends(tmp_path / "replica")
    sizes = []
    while replica.reported < end:
        chunks = list(shipping.chunks(replica, end))
        assert 0 < len(chunks) <= CONFIG.replication_chunks_in_flight_max
        for offset, data in chunks:
            segment_start = offset - offset % CONFIG.segment_size_bytes
            assert offset + len(data) <= min(end, segment_start + CONFIG.segment_size_bytes)
            assert append(appends, offset, data) == ""
            sizes.append(len(data))
        shipping.report(origin, appends.log.written_offset, restart=False, confirmed=end, min_offset=0, now_ms=1)
    assert log_bytes(tmp_path / "replica", 0, end, CONFIG.segment_size_bytes) == \
        log_bytes(tmp_path / "master", 0, end, CONFIG.segment_size_bytes)
    assert appends.next_queue_offset == queues
    assert appends.last_store_timestamp_ms == 2_119
    assert max(sizes) > CONFIG.replication_chunk_bytes_max  # a record larger than a chunk went alone
    appends.log.close()
    shipping.close()


def test_a_chunk_never_passes_the_confirmed_end_and_one_not_for_the_end_changes_nothing(tmp_path: Path) -> None:
    end, _queues = write_master(tmp_path / "master", random.Random(9), 30)
    shipping = LogShipping(tmp_path / "master", CONFIG)
    confirmed = end // 2
    data = shipping.read_chunk(0, confirmed)
    assert 0 < len(data) <= confirmed
    whole = shipping.read_chunk(0, end)
    assert whole.startswith(data)
    appends = replica_appends(tmp_path / "replica")
    assert append(appends, 0, data) == ""
    reason = append(appends, len(data) + 1, whole[len(data):])
    assert "log ends at" in reason and appends.log.written_offset == len(data)
    reason = append(appends, len(data), b"\x00" * 100)  # not a record
    assert "damaged" in reason and appends.log.written_offset == len(data)
    reason = appends.append_replicated(len(data), whole[len(data):], deletions_crc=NO_DELETIONS + 1,
                                       own_deletions_crc=NO_DELETIONS)  # sent after a deletion it has not
    assert "deletion table" in reason and appends.log.written_offset == len(data)
    appends.log.close()
    shipping.close()


def test_reports_a_master_cannot_follow_are_refused_with_the_reason(tmp_path: Path) -> None:
    shipping = LogShipping(tmp_path, CONFIG)
    origin = Origin(REPLICATION, b"r1")
    ahead = shipping.report(origin, 5_000, restart=True, confirmed=4_000, min_offset=0, now_ms=0)
    assert isinstance(ahead, str) and "past this master's" in ahead
    below = shipping.report(origin, 100, restart=True, confirmed=9 * CONFIG.segment_size_bytes,
                            min_offset=CONFIG.segment_size_bytes, now_ms=0)
    assert isinstance(below, str) and "oldest segment" in below
    empty = shipping.report(origin, 0, restart=True, confirmed=9 * CONFIG.segment_size_bytes,
                            min_offset=CONFIG.segment_size_bytes, now_ms=0)
    assert not isinstance(empty, str) and empty.next_offset == CONFIG.segment_size_bytes
    assert shipping.drop_silent(CONFIG.replica_silence_ms_max + 1) == [empty]
