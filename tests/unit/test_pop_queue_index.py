"""The pop groups' ack state: journal and segment layouts, fold, deletion of done segments, replay."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from engine.services.pop.index_set import IndexSet
from engine.store.pop_files import (
    JOURNAL_ENTRY_BYTES,
    JOURNAL_FILE,
    SEGMENT_ENTRY_COUNT,
    SEGMENT_FILE_BYTES,
    Action,
    Entry,
    State,
    decode_entry,
    encode_entry,
    encode_segment,
    read_journal,
    segment_path,
)

pytestmark = pytest.mark.timeout(120)


def test_a_journal_entry_has_its_golden_bytes() -> None:
    raw = encode_entry(Entry(0x0102030405060708, Action.DELIVER, attempt=3, generation=7,
                             invisible_until_ms=0x1122334455667788))
    head = bytes.fromhex("0102030405060708" "1122334455667788" "00000007" "0003" "01" "00" "00000000")
    assert raw[:28] == head
    assert raw[28:] == zlib.crc32(head).to_bytes(4, "big")
    assert decode_entry(raw) == Entry(0x0102030405060708, Action.DELIVER, 3, 7, 0x1122334455667788)
    assert decode_entry(bytes(JOURNAL_ENTRY_BYTES)) is None, "a zeroed entry is not an entry"


def test_a_segment_has_its_golden_header_and_entries() -> None:
    entries = bytearray(SEGMENT_ENTRY_COUNT * 16)
    entries[16:32] = bytes.fromhex("0000000000000064" "00000002" "0001" "01" "00")  # offset 1: delivered
    data = encode_segment(5, entries, open_count=1, done_count=0)
    assert len(data) == SEGMENT_FILE_BYTES == 32 + 16_384 * 16
    assert data[:32] == (b"PSEG" + bytes.fromhex("0001" "0000" "0000000000000005" "00000001" "00000000")
                         + zlib.crc32(entries).to_bytes(4, "big") + bytes(4))


def new_states(tmp_path: Path, **kwargs: int) -> IndexSet:
    return IndexSet(tmp_path, journal_entries_max=kwargs.get("journal_entries_max", 65_536))


def deliver(states: IndexSet, offsets: range, *, until: int = 10**13) -> None:
    queue = states.open("g", "t", 0)
    for offset in offsets:
        queue.record(offset, Action.DELIVER, 1, 1, until)
    states.write(queue, 0)


def ack(states: IndexSet, offsets: range) -> None:
    queue = states.open("g", "t", 0)
    for offset in offsets:
        queue.record(offset, Action.ACK)
    states.write(queue, 0)


def reopened(tmp_path: Path, states: IndexSet) -> IndexSet:
    """As after a kill: no fold, no close; the files as they are."""
    for queue in states.queues.values():
        queue.journal.close()
    return new_states(tmp_path)


def test_the_journal_replays_over_nothing(tmp_path: Path) -> None:
    states = new_states(tmp_path)
    deliver(states, range(10))
    ack(states, range(0, 10, 2))
    queue = reopened(tmp_path, states).open("g", "t", 0)
    assert [queue.entry(o)[0] for o in range(10)] == [State.ACKED, State.DELIVERED] * 5
    assert (queue.cursor, queue.in_flight, queue.ack_floor()) == (10, 5, 1)


def test_a_fold_writes_segments_and_empties_the_journal(tmp_path: Path) -> None:
    states = new_states(tmp_path)
    deliver(states, range(20_000))
    ack(states, range(0, 20_000, 3))
    queue = states.open("g", "t", 0)
    states.fold(queue)
    directory = queue.directory
    assert (directory / JOURNAL_FILE).stat().st_size == 0
    assert segment_path(directory, 0).exists() and segment_path(directory, 1).exists()
    again = reopened(tmp_path, states).open("g", "t", 0)
    assert all(again.entry(o)[0] == (State.ACKED if o % 3 == 0 else State.DELIVERED) for o in range(20_000))
    assert again.cursor == 20_000


def test_the_fold_past_the_journal_limit_and_the_deletion_of_fully_acked_segments(tmp_path: Path) -> None:
    states = new_states(tmp_path, journal_entries_max=1_000)
    total = 2 * SEGMENT_ENTRY_COUNT + 10
    for start in range(0, total, 500):
        deliver(states, range(start, min(total, start + 500)))
        ack(states, range(start, min(total, start + 500)))
    queue = states.open("g", "t", 0)
    assert queue.journal.entries < 1_000, "folded on the way"
    states.fold(queue)
    directory = queue.directory
    assert not segment_path(directory, 0).exists() and not segment_path(directory, 1).exists(), \
        "fully acknowledged segments are deleted"
    assert segment_path(directory, 2).exists(), "the newest one stays: it keeps the cursor"
    again = reopened(tmp_path, states).open("g", "t", 0)
    assert (again.cursor, again.ack_floor(), again.in_flight) == (total, total, 0)


def test_skipped_offsets_below_the_cursor_are_done_after_a_fold(tmp_path: Path) -> None:
    states = new_states(tmp_path)
    queue = states.open("g", "t", 0)
    queue.cursor = 100  # the group started at offset 100: 0..99 were never its business
    deliver(states, range(100, 105))
    queue.cursor = 110  # 105..109 not matched by its subscription
    ack(states, range(100, 105))
    states.fold(queue)
    again = reopened(tmp_path, states).open("g", "t", 0)
    assert again.entry(107)[0] == State.SKIPPED and again.entry(109)[0] == State.SKIPPED
    assert (again.cursor, again.ack_floor()) == (110, 110)


@pytest.mark.parametrize("cut", range(1, 2 * JOURNAL_ENTRY_BYTES + 1))
def test_a_torn_journal_tail_is_cut_at_every_byte(tmp_path: Path, cut: int) -> None:
    states = new_states(tmp_path)
    deliver(states, range(4))
    ack(states, range(2))
    queue = states.open("g", "t", 0)
    path = queue.journal.path
    whole = path.read_bytes()
    for queue in states.queues.values():
        queue.journal.close()
    torn = bytearray(whole[: len(whole) - cut])
    path.write_bytes(bytes(torn))
    survivors = len(torn) // JOURNAL_ENTRY_BYTES
    again = new_states(tmp_path).open("g", "t", 0)
    assert path.stat().st_size == survivors * JOURNAL_ENTRY_BYTES, "the torn part is cut"
    expected = read_journal(whole[: survivors * JOURNAL_ENTRY_BYTES]).entries
    assert len(expected) == survivors
    # Entries were 4 delivers then 2 acks: the state is the surviving prefix's, so a lost
    # ack means a redelivery, and nothing is ever acked that was not.
    last = {entry.queue_offset: entry.action for entry in expected}
    states_after = {Action.DELIVER: State.DELIVERED, Action.ACK: State.ACKED}
    for offset in range(4):
        assert again.entry(offset)[0] == states_after.get(last.get(offset), State.NONE), offset
    assert again.cursor == (max(last) + 1 if last else -1)
    assert again.damaged_entries == 0


def test_garbage_in_the_last_entry_is_a_torn_tail_not_damage(tmp_path: Path) -> None:
    states = new_states(tmp_path)
    deliver(states, range(3))
    path = states.open("g", "t", 0).journal.path
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    states.open("g", "t", 0).journal.close()
    path.write_bytes(bytes(data))
    again = new_states(tmp_path).open("g", "t", 0)
    assert again.damaged_entries == 0 and again.cursor == 2


def test_damage_mid_journal_never_turns_an_unacknowledged_message_into_a_done_one(tmp_path: Path) -> None:
    states = new_states(tmp_path)
    deliver(states, range(10))
    ack(states, range(5))
    path = states.open("g", "t", 0).journal.path
    data = bytearray(path.read_bytes())
    data[7 * JOURNAL_ENTRY_BYTES + 3] ^= 0x40  # the DELIVER of offset 7
    states.open("g", "t", 0).journal.close()
    path.write_bytes(bytes(data))
    again = new_states(tmp_path).open("g", "t", 0)
    assert again.damaged_entries == 1
    assert again.entry(7)[0] == State.DELIVERED, "no surviving entry explains it: redelivered"
    assert [again.entry(o)[0] for o in range(5)] == [State.ACKED] * 5
    assert again.in_flight == 5


def test_a_damaged_segment_is_read_as_all_delivered(tmp_path: Path) -> None:
    states = new_states(tmp_path)
    deliver(states, range(50))
    ack(states, range(50))
    queue = states.open("g", "t", 0)
    deliver(states, range(50, 51))
    states.fold(queue)
    path = segment_path(queue.directory, 0)
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    again = reopened(tmp_path, states).open("g", "t", 0, queue_end=51)
    assert all(again.entry(o)[0] == State.DELIVERED for o in range(51))
    assert again.entry(51)[0] == State.NONE


def test_expiries_are_one_heap_entry_per_batch_and_skip_acked_ones(tmp_path: Path) -> None:
    states = new_states(tmp_path)
    queue = states.open("g", "t", 0)
    for offset in range(32):
        queue.record(offset, Action.DELIVER, 1, 1, 1_000)
    states.schedule(queue, 1_000, range(32), 1)
    queue.record(3, Action.ACK)
    assert len(states.expiries) == 1
    assert states.expire(999) == set()
    assert states.expire(1_000) == {queue}
    assert list(queue.due) == [o for o in range(32) if o != 3]


def test_close_folds_and_a_restart_schedules_what_was_in_flight(tmp_path: Path) -> None:
    states = new_states(tmp_path)
    deliver(states, range(3), until=5_000)
    states.close()
    assert os.path.getsize(tmp_path / "pop" / "g" / "t" / "0" / JOURNAL_FILE) == 0
    again = new_states(tmp_path)
    queue = again.open("g", "t", 0)
    assert again.expire(5_000) == {queue} and list(queue.due) == [0, 1, 2]


def test_state_past_the_end_of_the_queue_is_dropped_at_recovery(tmp_path: Path) -> None:
    """A power cut under ASYNC_FLUSH can take the log's tail after the journal reached the disk:
    the offsets past the queue's new end will hold new messages, which must be delivered."""
    from engine.offline.check_pop import check_pop_queue

    states = new_states(tmp_path)
    deliver(states, range(10))
    ack(states, range(8))
    directory = states.open("g", "t", 0).directory
    queue = reopened(tmp_path, states).open("g", "t", 0, queue_end=6)
    assert queue.cursor == 6 and queue.in_flight == 0
    assert [queue.entry(o)[0] for o in range(5, 10)] == [State.ACKED] + [State.NONE] * 4
    assert (directory / JOURNAL_FILE).stat().st_size == 0, "folded at once"
    assert check_pop_queue(directory, 6, "g/t/0") == []
    assert new_states(tmp_path).open("g", "t", 0, queue_end=6).cursor == 6


def test_a_full_disk_refuses_the_request_and_leaves_no_partial_entry(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from engine.errors import ErrorCode, RequestError
    from engine.store import pop_files

    states = new_states(tmp_path)
    deliver(states, range(2))
    queue = states.open("g", "t", 0)
    real_write = os.write

    def half_then_full(fd: int, data: bytes) -> int:
        real_write(fd, bytes(data)[: len(data) // 2 + 3])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pop_files.os, "write", half_then_full)
    queue.record(0, Action.ACK)
    with pytest.raises(RequestError) as refused:
        states.write(queue, 0)
    assert refused.value.code == ErrorCode.DISK_FULL
    assert queue.journal.path.stat().st_size == 2 * JOURNAL_ENTRY_BYTES, "the partial entry is cut back"
    monkeypatch.setattr(pop_files.os, "write", real_write)
    states.write(queue, 0)  # the disk has room again: the waiting entry goes now
    again = reopened(tmp_path, states).open("g", "t", 0)
    assert [again.entry(o)[0] for o in range(2)] == [State.ACKED, State.DELIVERED]
    assert again.damaged_entries == 0
