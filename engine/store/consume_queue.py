"""ConsumeQueue: per (topic, queue_id), a dense array of 20-byte units into the log.

Directory ``consumequeue/{topic}/{queue_id}/``; files of
``consume_queue_file_units`` units named by their logical byte offset
(queue offset x 20), as RocketMQ names them.

Invariants:

* unit n describes the record whose QUEUEOFFSET is n;
* units are written in commit log order, so ``max_physical_end`` (end of the
  last unit's record) only grows, and a unit is applied at most once (a put at
  or below it is a duplicate and is skipped: dispatch is idempotent);
* every unit points below the commit log's confirmed offset;
* a unit whose size is 0 marks the end of the queue; a gap in queue offsets
  (a damaged record that was never dispatched) is filled with ``BLANK_UNIT``
  units (RocketMQ's fillPreBlank) which a pull skips.
"""

from __future__ import annotations

import mmap
import os
import shutil
from pathlib import Path
from typing import NamedTuple

from engine.layout import CQ_UNIT, CQ_UNIT_BYTES, offset_to_file_name
from engine.names import is_decimal, is_topic_name
from engine.store.mapped_file import MappedFile, MappedFileQueue

CONSUME_QUEUE_DIR = "consumequeue"
BLANK_UNIT_SIZE = 0x7FFFFFFF
_TAIL_CHECK_BYTES = 64 * 1024


class Unit(NamedTuple):
    commit_log_offset: int
    size: int
    tags_code: int

    @property
    def is_blank(self) -> bool:
        return self.size == BLANK_UNIT_SIZE

    @property
    def is_plausible(self) -> bool:
        """Not blank and shaped like a pointer to a record (a damaged unit may still pass)."""
        return 0 < self.size < BLANK_UNIT_SIZE and self.commit_log_offset >= 0


def queue_dir(store_dir: Path, topic: str, queue_id: int) -> Path:
    return store_dir / CONSUME_QUEUE_DIR / topic / str(queue_id)


def list_queues(store_dir: Path) -> list[tuple[str, int]]:
    """Every (topic, queue_id) that has a ConsumeQueue directory."""
    root = store_dir / CONSUME_QUEUE_DIR
    found: list[tuple[str, int]] = []
    if not root.is_dir():
        return found
    for topic_entry in os.scandir(root):
        if not topic_entry.is_dir() or not is_topic_name(topic_entry.name):
            continue
        for queue_entry in os.scandir(topic_entry.path):
            if queue_entry.is_dir() and is_decimal(queue_entry.name):
                found.append((topic_entry.name, int(queue_entry.name)))
    found.sort()
    return found


class ConsumeQueue:
    """One queue's units. Only the queue's owner opens it writable."""

    def __init__(self, store_dir: Path, topic: str, queue_id: int, *, file_units: int, writable: bool,
                 reserve_step_bytes: int | None = None) -> None:
        """``reserve_step_bytes``: new files are sparse, blocks reserved up to this far ahead of
        the units (``MappedFile.reserve``); None makes them fully allocated."""
        self.topic = topic
        self.queue_id = queue_id
        self.file_units = file_units
        self.file_bytes = file_units * CQ_UNIT_BYTES
        self.files = MappedFileQueue(queue_dir(store_dir, topic, queue_id), self.file_bytes, writable=writable,
                                     reserve_step_bytes=reserve_step_bytes)
        self.min_offset = 0
        self.max_offset = 0  # number of units = next queue offset
        self.max_physical_end = 0
        self.unsynced_starts: set[int] = set()  # files written since take_unsynced
        # The window: bytes [window_start, window_end) of the queue, in the newest file's mapping
        # (window), reserved and in unsynced_starts, where the next units may be written without
        # this object (codec.cq_put_packed: it moves max_offset and max_physical_end). Closed
        # (window_end 0) by whatever else changes the files or what a flush covers.
        self.window: mmap.mmap | None = None
        self.window_start = self.window_end = 0
        self._load()

    def _load(self) -> None:
        first = self.files.first_offset()
        if first is None:
            return
        self.min_offset = first // CQ_UNIT_BYTES
        # The queue ends in the last file that holds a unit. A later file may hold none: a
        # power cut keeps a new file (its creation is synced) and loses the units written into
        # it, and ``truncate_from`` zeroes units without removing files. Ending the queue at the
        # start of such a file would count the zeroed units before it as units, and the
        # writer's recovery would give the next record a queue offset past them: a gap.
        for start in reversed(self.files.known):
            used = self._units_in(start)
            if used or start == first:
                self.max_offset = start // CQ_UNIT_BYTES + used
                break
        self.max_physical_end = self._last_physical_end()

    def _units_in(self, start: int) -> int:
        """How many units the file at ``start`` holds: up to its last non-zero byte."""
        mapped = self.files.get(start)
        assert mapped is not None
        # The end is after the last non-zero byte, not at the first zero unit: a unit zeroed
        # by damage must not hide the units after it (they are checked when read). Bisection
        # finds the first zero unit; only if bytes follow it is the whole file searched.
        lo = self._first_empty_unit(mapped, 0)
        after = lo * CQ_UNIT_BYTES
        if mapped.mm[after:after + _TAIL_CHECK_BYTES].strip(b"\x00") or \
                mapped.mm[-_TAIL_CHECK_BYTES:].strip(b"\x00"):
            used = len(mapped.mm[:].rstrip(b"\x00"))
            lo = -(-used // CQ_UNIT_BYTES)
        return lo

    def _first_empty_unit(self, mapped: MappedFile, lo: int) -> int:
        """The first unit at or after ``lo`` whose size is 0, bisected (units are written in order)."""
        hi = self.file_units
        while lo < hi:
            mid = (lo + hi) // 2
            if CQ_UNIT.unpack_from(mapped.mm, mid * CQ_UNIT_BYTES)[1] == 0:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def follow_end(self) -> None:
        """For a reader of a queue its owner writes (read-only): take in the units appended since,
        up to the first empty unit (``_first_empty_unit``, as ``_units_in`` does); the next file is looked for
        once the last known one is full."""
        while True:
            byte_offset = self.max_offset * CQ_UNIT_BYTES
            mapped = self.files.find(byte_offset)
            if mapped is None:
                self.files.refresh()
                mapped = self.files.find(byte_offset)
                if mapped is None:
                    return
            lo = self._first_empty_unit(mapped, (byte_offset - mapped.start_offset) // CQ_UNIT_BYTES)
            self.max_offset = mapped.start_offset // CQ_UNIT_BYTES + lo
            if lo < self.file_units:
                return

    def _last_physical_end(self) -> int:
        for queue_offset in range(self.max_offset - 1, max(self.min_offset, self.max_offset - 64) - 1, -1):
            unit = self.get(queue_offset)
            if unit is not None and unit.is_plausible:
                return unit.commit_log_offset + unit.size
        return 0

    def get(self, queue_offset: int) -> Unit | None:
        if not self.min_offset <= queue_offset < self.max_offset:
            return None
        byte_offset = queue_offset * CQ_UNIT_BYTES
        mapped = self.files.find(byte_offset)
        if mapped is None:
            return None
        return Unit(*CQ_UNIT.unpack_from(mapped.mm, byte_offset - mapped.start_offset))

    def read(self, queue_offset: int, count: int) -> list[Unit]:
        """Up to ``count`` units from ``queue_offset``, within one file (as RocketMQ reads)."""
        units, pos, found = self.unit_span(queue_offset, count)
        return [Unit(*fields) for fields in CQ_UNIT.iter_unpack(units[pos:pos + found * CQ_UNIT_BYTES])]

    def unit_span(self, queue_offset: int, count: int) -> tuple[bytes | mmap.mmap, int, int]:
        """Where ``read`` would read: (buffer, byte position, number of units)."""
        if not self.min_offset <= queue_offset < self.max_offset:
            return b"", 0, 0
        byte_offset = queue_offset * CQ_UNIT_BYTES
        mapped = self.files.find(byte_offset)
        if mapped is None:
            return b"", 0, 0
        end_units = min(queue_offset + count, self.max_offset,
                        (mapped.start_offset + mapped.size_bytes) // CQ_UNIT_BYTES)
        return mapped.mm, byte_offset - mapped.start_offset, end_units - queue_offset

    def put(self, queue_offset: int, commit_log_offset: int, size: int, tags_code: int) -> bool:
        """Write the unit for ``queue_offset``; False if it was already there (a replay)."""
        if commit_log_offset + size <= self.max_physical_end or queue_offset < self.max_offset:
            return False
        while self.max_offset < queue_offset:
            self._write(self.max_offset, 0, BLANK_UNIT_SIZE, 0)
        self._write(queue_offset, commit_log_offset, size, tags_code)
        self.max_physical_end = commit_log_offset + size
        return True

    def _write(self, queue_offset: int, commit_log_offset: int, size: int, tags_code: int) -> None:
        assert queue_offset == self.max_offset
        byte_offset = queue_offset * CQ_UNIT_BYTES
        start = byte_offset - byte_offset % self.file_bytes
        mapped = self.files.get(start) or self.files.create(start)
        mapped.reserve(byte_offset - start + CQ_UNIT_BYTES)  # ENOSPC here, never a SIGBUS on the write
        CQ_UNIT.pack_into(mapped.mm, byte_offset - start, commit_log_offset, size, tags_code)
        self.max_offset = queue_offset + 1
        self.unsynced_starts.add(start)
        self.window, self.window_start = mapped.mm, start
        self.window_end = start + min(mapped.reserved_bytes, mapped.size_bytes)

    def _close_window(self) -> None:
        self.window, self.window_end = None, 0

    def take_unsynced(self) -> list[Path]:
        """The files written since the last call: what the next flush must cover."""
        starts, self.unsynced_starts = self.unsynced_starts, set()
        self._close_window()  # its file must be counted again by the next write
        return [self.files.directory / offset_to_file_name(start) for start in sorted(starts)]

    def overwrite(self, queue_offset: int, commit_log_offset: int, size: int, tags_code: int) -> None:
        """Replace a damaged unit below ``max_offset`` with the one rebuilt from the log."""
        assert self.min_offset <= queue_offset < self.max_offset
        byte_offset = queue_offset * CQ_UNIT_BYTES
        mapped = self.files.find(byte_offset)
        assert mapped is not None
        mapped.reserve(byte_offset - mapped.start_offset + CQ_UNIT_BYTES)
        CQ_UNIT.pack_into(mapped.mm, byte_offset - mapped.start_offset, commit_log_offset, size, tags_code)
        self.unsynced_starts.add(mapped.start_offset)

    def drop_before(self, log_min_offset: int) -> int:
        """Retention: delete files (never the last) whose units all point below ``log_min_offset``,
        then move ``min_offset`` to the first unit at or above it (ConsumeQueue#correctMinOffset).
        Returns how many files were deleted."""
        deleted = 0
        self._close_window()
        self.files.refresh()
        for start in self.files.known[:-1]:
            last_unit = self.get(min(self.max_offset, (start + self.file_bytes) // CQ_UNIT_BYTES) - 1)
            # A blank last unit (a power cut lost its page, or damage zeroed it) says nothing of where
            # the file's records are: the file stays. Read as offset 0 it would look expired.
            if last_unit is None or not last_unit.is_plausible or \
                    last_unit.commit_log_offset + last_unit.size > log_min_offset:
                break
            self.files.delete(start)
            deleted += 1
        first = self.files.first_offset()
        self.min_offset = self.first_live_unit(log_min_offset, start=max(self.min_offset,
                                                                        (first or 0) // CQ_UNIT_BYTES))
        return deleted

    def first_live_unit(self, log_min_offset: int, *, start: int | None = None) -> int:
        """The first queue offset (from ``start``, default ``min_offset``) whose record is at or
        above ``log_min_offset``, i.e. still in the log; ``max_offset`` if none is."""
        lo = self.min_offset if start is None else start
        hi = self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            unit = self.get(mid)
            if unit is not None and unit.is_plausible and unit.commit_log_offset < log_min_offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def truncate_from(self, queue_offset: int) -> None:
        """Drop units at and after ``queue_offset`` by zeroing them (the files stay whole).

        The files zeroed are flushed with the next units (``take_unsynced``): the units dropped
        may be on disk already, and a power cut must not bring them back."""
        queue_offset = max(queue_offset, self.min_offset)
        self._close_window()
        for offset in range(queue_offset, self.max_offset):
            byte_offset = offset * CQ_UNIT_BYTES
            mapped = self.files.find(byte_offset)
            if mapped is not None:  # zero skips zero pages: they may be holes
                mapped.zero(byte_offset - mapped.start_offset, byte_offset - mapped.start_offset + CQ_UNIT_BYTES)
                self.unsynced_starts.add(mapped.start_offset)
        self.max_offset = min(self.max_offset, queue_offset)
        self.max_physical_end = self._last_physical_end()

    def flush(self) -> None:
        for mapped in list(self.files.files.values()):
            mapped.flush()

    def close(self) -> None:
        self._close_window()
        self.files.close()


    def destroy(self) -> None:
        """Topic deletion: close the queue and remove its files (and its topic's directory once
        empty; another owner may still be removing its own queues there)."""
        self.close()
        shutil.rmtree(self.files.directory, ignore_errors=True)
        try:
            self.files.directory.parent.rmdir()
        except OSError:
            pass
