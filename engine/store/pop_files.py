"""The ack state of a pop consumer group, per (group, topic, queue): RabbitMQ's queue index.

Directory ``pop/{group}/{topic}/{queue_id}/`` holds a journal and segment files, as
RabbitMQ's ``rabbit_queue_index`` does for a queue (``journal.jif`` and ``N.idx``).
The queue offset plays RabbitMQ's SeqId: segment = offset // 16384, entry =
offset % 16384.

Every delivery, ack, change of invisible time and dead-letter move is appended to
the journal as one fixed 32-byte entry with its own CRC; the journal is folded into
the segments now and then (``engine/services/pop/queue_index.py`` says when) and emptied.

Journal entry (``journal.jif``, appended; big-endian)::

    0               8               16      20  22  23  24      28      32
    +---------------+---------------+-------+---+---+---+-------+-------+
    | QUEUEOFFSET   | INVISIBLEUNTIL| GEN   |ATT|ACT|RSV| RSV   | CRC   |
    | i64           | i64 (wall ms) | u32   |u16|u8 |u8 | u32   | u32   |
    +---------------+---------------+-------+---+---+---+-------+-------+

    CRC: zlib.crc32 of bytes 0..28. A zeroed entry fails it (crc32 of zeros is not 0).

Segment file (``{segment:010d}.idx``, written whole with ``write_atomically``)::

    header, 32 bytes:
    0       4       6       8               16      20      24      28      32
    +-------+-------+-------+---------------+-------+-------+-------+-------+
    | MAGIC | VER   | RSV   | SEGMENT u64   | OPEN  | DONE  | CRC   | RSV   |
    | "PSEG"| u16   | u16   |               | u32   | u32   | u32   | u32   |
    +-------+-------+-------+---------------+-------+-------+-------+-------+
    OPEN: entries delivered and not done; DONE: entries acked, dead-lettered or skipped;
    CRC: zlib.crc32 of the entries.

    then 16384 entries of 16 bytes, entry i for queue offset segment * 16384 + i:
    0               8       12  14  15  16
    +---------------+-------+---+---+---+
    | INVISIBLEUNTIL| GEN   |ATT|ST |RSV|
    | i64 (wall ms) | u32   |u16|u8 |u8 |
    +---------------+-------+---+---+---+
"""

from __future__ import annotations

import enum
import errno
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from engine.store import sync
from engine.store.atomic_file import write_atomically

SEGMENT_ENTRY_COUNT = 16_384  # RabbitMQ's ?SEGMENT_ENTRY_COUNT
JOURNAL_FILE = "journal.jif"
SEGMENT_SUFFIX = ".idx"
POP_DIR = "pop"
INCARNATION_FILE = "incarnation"  # the topic's deletion offset when the state was created ("-1": none)

JOURNAL_ENTRY = struct.Struct(">qqIHBBII")
JOURNAL_ENTRY_BYTES = 32
_JOURNAL_CRC_SPAN = 28
_JOURNAL_CRC = struct.Struct(">I")

SEGMENT_HEADER = struct.Struct(">4sHHQIIII")
SEGMENT_HEADER_BYTES = 32
SEGMENT_ENTRY = struct.Struct(">qIHBB")
SEGMENT_ENTRY_BYTES = 16
SEGMENT_STATE_POSITION = 14  # of the ST byte in a segment entry: entries[14::16] are all the states
SEGMENT_MAGIC = b"PSEG"
SEGMENT_VERSION = 1
SEGMENT_FILE_BYTES = SEGMENT_HEADER_BYTES + SEGMENT_ENTRY_COUNT * SEGMENT_ENTRY_BYTES

assert JOURNAL_ENTRY.size == JOURNAL_ENTRY_BYTES
assert SEGMENT_HEADER.size == SEGMENT_HEADER_BYTES
assert SEGMENT_ENTRY.size == SEGMENT_ENTRY_BYTES


class Action(enum.IntEnum):
    """What a journal entry records for its queue offset."""

    DELIVER = 1  # delivered (attempt, receipt generation, invisible until)
    ACK = 2  # acknowledged by the group
    DEAD = 3  # moved to the group's dead-letter queue
    CHANGE = 4  # invisible time changed (new generation and invisible until); nack is a change to now
    SKIP = 5  # done without delivery: not matched by the subscription, or deleted by retention


class State(enum.IntEnum):
    """The state of a queue offset for a group, as a segment entry holds it."""

    NONE = 0  # not delivered yet (or, below the pop cursor, skipped before the fold)
    DELIVERED = 1  # in flight or waiting for redelivery
    ACKED = 2
    DEAD = 3
    SKIPPED = 4


DONE_STATES = frozenset({State.ACKED, State.DEAD, State.SKIPPED})
ACTION_STATE = {Action.DELIVER: State.DELIVERED, Action.ACK: State.ACKED, Action.DEAD: State.DEAD,
                Action.SKIP: State.SKIPPED}  # what each action leaves (CHANGE keeps DELIVERED)


@dataclass(frozen=True)
class Entry:
    queue_offset: int
    action: Action
    attempt: int = 0
    generation: int = 0
    invisible_until_ms: int = 0


def encode_entry(entry: Entry) -> bytes:
    buf = bytearray(JOURNAL_ENTRY_BYTES)
    pack_entry(buf, 0, entry.queue_offset, entry.action, entry.attempt, entry.generation, entry.invisible_until_ms)
    return bytes(buf)


def pack_entry(buf: bytearray, pos: int, queue_offset: int, action: int, attempt: int, generation: int,
               invisible_until_ms: int) -> None:
    """One journal entry, with its CRC, at ``buf[pos:pos + 32]``."""
    JOURNAL_ENTRY.pack_into(buf, pos, queue_offset, invisible_until_ms, generation, attempt, action, 0, 0, 0)
    with memoryview(buf) as view:
        _JOURNAL_CRC.pack_into(buf, pos + _JOURNAL_CRC_SPAN, zlib.crc32(view[pos:pos + _JOURNAL_CRC_SPAN]))


def decode_entry(data: bytes | memoryview, pos: int = 0) -> Entry | None:
    """The entry at ``pos``, or None when it fails its CRC or holds no known action."""
    offset, until, generation, attempt, action, _rsv, _rsv2, crc = JOURNAL_ENTRY.unpack_from(data, pos)
    if zlib.crc32(memoryview(data)[pos:pos + _JOURNAL_CRC_SPAN]) != crc or action not in Action._value2member_map_:
        return None
    if offset < 0:
        return None
    return Entry(offset, Action(action), attempt, generation, until)


@dataclass
class JournalReplay:
    entries: list[Entry]
    valid_bytes: int  # the journal's length once its torn tail is cut
    damaged_entries: int  # entries that failed their check with good entries after them (not a torn tail)


def read_journal(data: bytes) -> JournalReplay:
    """Every intact entry in order. Bad entries at the end are a torn tail (cut); a bad entry
    followed by a good one is damage, counted and skipped."""
    entries: list[Entry] = []
    damaged = 0
    bad_run = 0
    valid_bytes = 0
    whole = len(data) - len(data) % JOURNAL_ENTRY_BYTES
    for pos in range(0, whole, JOURNAL_ENTRY_BYTES):
        entry = decode_entry(data, pos)
        if entry is None:
            bad_run += 1
            continue
        damaged += bad_run
        bad_run = 0
        entries.append(entry)
        valid_bytes = pos + JOURNAL_ENTRY_BYTES
    return JournalReplay(entries, valid_bytes, damaged)


class Journal:
    """The append-only journal of one (group, topic, queue)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / JOURNAL_FILE
        directory.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.entries = os.fstat(self.fd).st_size // JOURNAL_ENTRY_BYTES
        self.unsynced = False

    def read(self) -> JournalReplay:
        size = os.fstat(self.fd).st_size
        return read_journal(os.pread(self.fd, size, 0) if size else b"")

    def cut(self, length: int) -> None:
        """Drop everything past ``length`` (a torn tail), durably."""
        os.ftruncate(self.fd, length)
        sync.fdatasync(self.fd, self.path)
        self.entries = length // JOURNAL_ENTRY_BYTES

    def append(self, data: bytes | bytearray) -> None:
        """All of ``data`` or nothing: a write the disk refused part way (ENOSPC) is cut back, so
        no partial entry is left for later entries to follow (that would read as damage)."""
        before = self.entries * JOURNAL_ENTRY_BYTES
        try:
            written = os.write(self.fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"short write to the journal: {written} of {len(data)} bytes")
        except OSError:
            os.ftruncate(self.fd, before)
            raise
        self.entries += len(data) // JOURNAL_ENTRY_BYTES
        self.unsynced = True

    def sync(self) -> None:
        if self.unsynced:
            self.unsynced = False
            sync.fdatasync(self.fd, self.path)

    def empty(self) -> None:
        """After a fold: every entry is in the segments, which are on disk."""
        self.cut(0)

    def close(self) -> None:
        os.close(self.fd)


def write_incarnation(directory: Path, deletion_offset: int) -> None:
    """Which life of its topic this state belongs to: the topic's deletion offset when it was made.
    A later deletion of the topic (a larger offset) makes the state a leftover."""
    write_atomically(directory / INCARNATION_FILE, b"%d\n" % deletion_offset)
    (directory / (INCARNATION_FILE + ".bak")).unlink(missing_ok=True)


def read_incarnation(directory: Path) -> int:
    try:
        return int((directory / INCARNATION_FILE).read_bytes())
    except (FileNotFoundError, ValueError):
        return -1


def is_leftover(directory: Path, deletion_offsets: dict[str, int]) -> bool:
    """True for the state of a queue whose topic was deleted after the state was made."""
    deletion_offset = deletion_offsets.get(directory.parent.name)
    return deletion_offset is not None and deletion_offset > read_incarnation(directory)


# -- segments -------------------------------------------------------------------------------------


class SegmentError(ValueError):
    """A segment file that is not one, or whose entries fail their CRC."""


def segment_path(directory: Path, segment: int) -> Path:
    return directory / f"{segment:010d}{SEGMENT_SUFFIX}"


def segment_numbers(directory: Path) -> list[int]:
    numbers = []
    for path in directory.glob(f"*{SEGMENT_SUFFIX}"):
        stem = path.name[: -len(SEGMENT_SUFFIX)]
        if stem.isascii() and stem.isdigit():
            numbers.append(int(stem))
    return sorted(numbers)


def encode_segment(segment: int, entries: bytearray, *, open_count: int, done_count: int) -> bytes:
    assert len(entries) == SEGMENT_ENTRY_COUNT * SEGMENT_ENTRY_BYTES
    header = SEGMENT_HEADER.pack(SEGMENT_MAGIC, SEGMENT_VERSION, 0, segment, open_count, done_count,
                                 zlib.crc32(entries), 0)
    return header + bytes(entries)


def decode_segment(data: bytes, segment: int) -> bytearray:
    """The entries of a segment file; SegmentError if it is not the segment it is named for."""
    if len(data) != SEGMENT_FILE_BYTES:
        raise SegmentError(f"{len(data)} bytes, not {SEGMENT_FILE_BYTES}")
    magic, version, _rsv, number, _open, _done, crc, _rsv2 = SEGMENT_HEADER.unpack_from(data)
    if magic != SEGMENT_MAGIC or version != SEGMENT_VERSION:
        raise SegmentError(f"not a pop segment (magic {magic!r}, version {version})")
    if number != segment:
        raise SegmentError(f"holds segment {number}, named {segment}")
    entries = bytearray(data[SEGMENT_HEADER_BYTES:])
    if zlib.crc32(entries) != crc:
        raise SegmentError("its entries fail their CRC")
    return entries


def write_segment(directory: Path, segment: int, data: bytes) -> None:
    path = segment_path(directory, segment)
    write_atomically(path, data)
    path.with_name(path.name + ".bak").unlink(missing_ok=True)
    sync.created(path)


def read_segment(directory: Path, segment: int) -> bytearray:
    return decode_segment(segment_path(directory, segment).read_bytes(), segment)
