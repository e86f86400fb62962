"""The timer's files: RocketMQ 5's timer log and timer wheel (``S/timer/TimerLog.java``,
``TimerWheel.java``), and the timer checkpoint (``config/timercheck``).

A pending timer costs 52 bytes of timer log on disk and nothing in memory. The wheel has
one slot per ``timer_precision_ms`` of time; each slot heads a list of the units due in
it, linked backwards through the log. Delivering a slot reads its list only: no scan of
pending timers per tick.

Timer log unit (``timerlog/{20-digit position}``, files of ``timer_log_segment_bytes``,
appended; big-endian as Java writes it)::

    0       4               12      16              24      28              36      40      44      48      52
    +-------+---------------+-------+---------------+-------+---------------+-------+-------+-------+-------+
    | SIZE  | PREV POS      | MAGIC | WRITE TIME MS | DELAY | OFFSET PY     |SIZE PY| TOPIC | CRC   | RSV   |
    | i32=52| i64, -1: none | i32 1 | i64           | i32 ms| i64           | i32   | HASH  | u32   | u32 0 |
    +-------+---------------+-------+---------------+-------+---------------+-------+-------+-------+-------+

    PREV POS: the slot's previous unit (the list runs backwards); DELAY: deliver time minus
    WRITE TIME; OFFSET PY/SIZE PY: the record in rmq_sys_wheel_timer; TOPIC HASH: Java's
    hashCode of the real topic. RocketMQ's 8 reserved bytes carry here a CRC32 of bytes
    0..44, so that a torn unit is never read as a timer.

Timer wheel slot (``timerwheel``, ``timer_wheel_slots`` x 32 bytes; slot index =
time // precision % slots)::

    0               8               16              24      28      32
    +---------------+---------------+---------------+-------+-------+
    | TIME MS       | FIRST POS     | LAST POS      | NUM   | MAGIC |
    | i64 slot start| i64           | i64 list head | i32   | i32 0 |
    +---------------+---------------+---------------+-------+-------+

    A slot whose TIME MS is not the time asked for is empty (a slot of an earlier turn).

Crash order: units are written to the log first; slot changes stay in memory and reach
the wheel file only at a checkpoint, after the log is synced, and the checkpoint file is
written last. After a crash the units past the checkpoint's log end are linked again
(``TimerWheel.relink``): the wheel never points at a unit the log lost.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import msgspec

from engine.store.atomic_file import read_with_backup, write_atomically
from engine.store.mapped_file import PAGE_BYTES, MappedFile, MappedFileQueue, create_preallocated, reserve_range

TIMER_LOG_DIR = "timerlog"
TIMER_WHEEL_FILE = "timerwheel"
TIMER_CHECKPOINT_FILE = "config/timercheck"

UNIT = struct.Struct(">iqiqiqiiII")
UNIT_BYTES = UNIT.size
assert UNIT_BYTES == 52
_CRC_SPAN = 44
MAGIC_DEFAULT = 1  # RocketMQ's TimerLog MAGIC_DEFAULT
SLOT = struct.Struct(">qqqii")
SLOT_BYTES = SLOT.size
assert SLOT_BYTES == 32
NO_UNIT = -1


class Unit(NamedTuple):
    pos: int
    prev_pos: int
    write_ms: int
    delay_ms: int
    offset_py: int
    size_py: int
    topic_hash: int

    @property
    def deliver_ms(self) -> int:
        return self.write_ms + self.delay_ms


class Slot(NamedTuple):
    time_ms: int
    first_pos: int
    last_pos: int
    units: int


class TimerCheckpoint(msgspec.Struct, kw_only=True):
    """The timer's progress (RocketMQ's ``TimerCheckpoint``), written after the log and the wheel.

    ``read_time_ms``: every slot before it is delivered; ``slot_log_start``: the commit-log
    offset the log ended at when that slot's delivery first began (in this run or one before),
    where a restart looks for moves already made; ``log_end``: the timer log's end, every unit before it linked in
    the wheel file; ``enqueue_next``: the next queue offset of rmq_sys_wheel_timer to read;
    ``files_due_until``: for each timer-log file, the latest deliver time of its units (a file
    is deleted once the read time passes it)."""

    read_time_ms: int = 0
    slot_log_start: int = 0
    log_end: int = 0
    enqueue_next: int = 0
    delivered: int = 0
    files_due_until: dict[int, int] = {}


def load_timer_checkpoint(store_dir: Path) -> TimerCheckpoint | None:
    return read_with_backup(store_dir / TIMER_CHECKPOINT_FILE,
                            lambda data: msgspec.json.decode(data, type=TimerCheckpoint))


def store_timer_checkpoint(store_dir: Path, checkpoint: TimerCheckpoint) -> None:
    write_atomically(store_dir / TIMER_CHECKPOINT_FILE, msgspec.json.encode(checkpoint))


def _pack_unit(buf: bytearray | memoryview | mmap.mmap, at: int, prev_pos: int, write_ms: int, delay_ms: int,
               offset_py: int, size_py: int, topic_hash: int) -> None:
    UNIT.pack_into(buf, at, UNIT_BYTES, prev_pos, MAGIC_DEFAULT, write_ms, delay_ms, offset_py, size_py, topic_hash,
                   0, 0)
    crc = zlib.crc32(bytes(buf[at:at + _CRC_SPAN]))
    struct.pack_into(">I", buf, at + _CRC_SPAN, crc)


class TimerLog:
    """The append-only log of units, in files of ``segment_bytes`` (a multiple of 52)."""

    def __init__(self, store_dir: Path, segment_bytes: int, *, reserve_step_bytes: int | None = None) -> None:
        """``reserve_step_bytes``: files are sparse, their blocks reserved up to this far ahead
        of the units (``MappedFile.reserve``); None makes them fully allocated."""
        self.files = MappedFileQueue(store_dir / TIMER_LOG_DIR, segment_bytes, writable=True,
                                     reserve_step_bytes=reserve_step_bytes)
        self.segment_bytes = segment_bytes
        self.end = 0

    def read(self, pos: int) -> Unit | None:
        """The unit at ``pos``, or None if there is none or it fails its checks."""
        mapped = self.files.find(pos)
        if mapped is None:
            return None
        at = pos - mapped.start_offset
        size, prev, magic, write_ms, delay, offset_py, size_py, topic_hash, crc, _ = UNIT.unpack_from(mapped.mm, at)
        if size != UNIT_BYTES or magic != MAGIC_DEFAULT or crc != zlib.crc32(mapped.mm[at:at + _CRC_SPAN]):
            return None
        return Unit(pos, prev, write_ms, delay, offset_py, size_py, topic_hash)

    def units_from(self, pos: int) -> Iterator[Unit]:
        """Every valid unit from ``pos`` on, up to the first invalid one."""
        while (unit := self.read(pos)) is not None:
            yield unit
            pos += UNIT_BYTES

    def open_at(self, end: int) -> None:
        """Appends go on at ``end``; what lies past it in its file is zeroed (a torn tail)."""
        self.end = end
        mapped = self.files.find(end)
        if mapped is not None:
            at = end - mapped.start_offset
            if any(mapped.mm[at:at + UNIT_BYTES]):
                mapped.zero(at, mapped.size_bytes)
        for start in list(self.files.known):
            if start > self.files.file_start(end):
                self.files.delete(start)

    def append(self, prev_pos: int, write_ms: int, delay_ms: int, offset_py: int, size_py: int,
               topic_hash: int) -> int:
        """Write one unit at the end; returns its position."""
        pos = self.end
        start = self.files.file_start(pos)
        mapped = self.files.get(start) or self.files.create(start)
        mapped.reserve(pos - start + UNIT_BYTES)  # ENOSPC here, never a SIGBUS on the write
        _pack_unit(mapped.mm, pos - start, prev_pos, write_ms, delay_ms, offset_py, size_py, topic_hash)
        self.end = pos + UNIT_BYTES
        return pos

    def flush(self) -> None:
        for mapped in list(self.files.files.values()):
            mapped.flush()

    def delete_delivered(self, due_until: dict[int, int], read_time_ms: int, *, recovery_from: int) -> list[int]:
        """Delete the full files whose every unit is due before ``read_time_ms`` (delivered); their starts.

        Never the file that holds ``recovery_from`` (the checkpoint's log end) or a later one: a
        restart reads the units from there on to link them again, and a file gone under that
        point would hide every unit after it (their slots would name units the log no longer has)."""
        current = self.files.file_start(min(self.end, recovery_from))
        gone = [start for start, until in due_until.items() if start < current and until < read_time_ms]
        for start in gone:
            self.files.delete(start)
        return gone

    def close(self) -> None:
        self.files.close()


class TimerWheel:
    """The slots, mapped; changes are kept in ``dirty`` until ``write_dirty`` (at a checkpoint)."""

    def __init__(self, store_dir: Path, slot_count: int, precision_ms: int, *, sparse: bool = False) -> None:
        """``sparse``: the wheel is created sparse and each page of slots gets real blocks before
        its first write (slots are written in any order), so a full disk is an ENOSPC error."""
        path = store_dir / TIMER_WHEEL_FILE
        size = slot_count * SLOT_BYTES
        if not path.exists():
            create_preallocated(path, size, reserve_bytes=0 if sparse else None)
        # OSError if the wheel was made with another size
        self.file = MappedFile(path, 0, size, writable=True, reserve_step_bytes=0 if sparse else None)
        self.reserved_pages: set[int] = set()  # pages of a sparse wheel given blocks by this process
        # A sparse wheel's slots are read with pread, not through the mapping: on a memory file
        # system (tmpfs) a page fault on a hole allocates a page even to read it, which on a full
        # one is a SIGBUS (verified here); pread of a hole gives zeros and allocates nothing.
        self.read_fd = os.open(path, os.O_RDONLY) if sparse else None
        self.slot_count = slot_count
        self.precision_ms = precision_ms
        self.dirty: dict[int, Slot] = {}

    def slot_start(self, time_ms: int) -> int:
        return time_ms - time_ms % self.precision_ms

    def get(self, slot_start: int) -> Slot:
        slot = self.dirty.get(slot_start)
        if slot is not None:
            return slot
        at = self._at(slot_start)
        if self.read_fd is None:
            time_ms, first, last, count, _ = SLOT.unpack_from(self.file.mm, at)
        else:
            time_ms, first, last, count, _ = SLOT.unpack(os.pread(self.read_fd, SLOT_BYTES, at))
        if time_ms != slot_start or count <= 0:
            return Slot(slot_start, NO_UNIT, NO_UNIT, 0)
        return Slot(time_ms, first, last, count)

    def _at(self, slot_start: int) -> int:
        return (slot_start // self.precision_ms) % self.slot_count * SLOT_BYTES

    def link(self, slot_start: int, pos: int) -> None:
        """Make the unit at ``pos`` the head of its slot's list."""
        slot = self.get(slot_start)
        first = slot.first_pos if slot.units else pos
        self.dirty[slot_start] = Slot(slot_start, first, pos, slot.units + 1)

    def relink(self, slot_start: int, unit: Unit) -> bool:
        """Recovery: link ``unit`` if the slot does not hold it yet; False if it did."""
        slot = self.get(slot_start)
        if slot.units and slot.last_pos >= unit.pos:
            return False
        self.link(slot_start, unit.pos)
        return True

    def unlink_head(self, slot_start: int, prev_pos: int) -> None:
        """Recovery: drop the head of the slot's list (a unit the log lost); ``prev_pos`` is next."""
        slot = self.get(slot_start)
        self.dirty[slot_start] = Slot(slot_start, slot.first_pos if slot.units > 1 else NO_UNIT, prev_pos,
                                      slot.units - 1)

    def write_dirty(self) -> None:
        """The slot changes into the file, synced (the log must be synced before).

        OSError (ENOSPC) before any slot is written if the disk cannot hold a new page of
        slots: the changes stay in ``dirty`` for the next try."""
        if self.file.reserved_bytes < self.file.size_bytes:
            pages = {self._at(slot_start) // PAGE_BYTES for slot_start in self.dirty} - self.reserved_pages
            for page in sorted(pages):
                reserve_range(self.file.path, page * PAGE_BYTES, min(self.file.size_bytes, (page + 1) * PAGE_BYTES))
                self.reserved_pages.add(page)
        for slot_start, slot in self.dirty.items():
            SLOT.pack_into(self.file.mm, self._at(slot_start), slot.time_ms, slot.first_pos, slot.last_pos,
                           slot.units, 0)
        self.file.flush()
        self.dirty.clear()

    def close(self) -> None:
        if self.read_fd is not None:
            os.close(self.read_fd)
            self.read_fd = None
        self.file.close()
