"""The CommitLog: one append-only log of records shared by every topic.

Offsets are absolute bytes (``commit_log_offset``). The log is a sequence of
fixed-size segments (``mapped_file.MappedFileQueue``); a segment that cannot
hold the next batch gets the 8-byte blank marker and the batch goes to the
next segment, so a batch never spans two segments.

Invariants (between recoveries, each only grows):

* ``flushed_offset <= confirmed_offset <= written_offset``;
* every byte below ``confirmed_offset`` belongs to a complete record or to a
  blank marker's padding;
* a record's PHYSICALOFFSET field equals its own position.

``CommitLogWriter`` is used by exactly one process (the writer actor).
``CommitLogReader`` is used by everyone else, read-only, never past the
offset the writer announced.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from engine import codec
from engine.codec_py import MessageMap, RecordItem
from engine.layout import (
    CRC32_PROPERTY_PREFIX,
    CRC32_RESERVED_BYTES,
    END_FILE_MIN_BLANK_BYTES,
    IPV6_BYTES,
    MAGIC_BLANK,
    MAGIC_V1,
    PHYSICAL_OFFSET_POSITION,
    HostAddress,
    Record,
    RecordError,
    RecordFields,
    RecordHead,
    decode_record,
    encode_blank,
    encoded_size,
    host_flags,
    offset_to_file_name,
    peek_size_and_magic,
    record_size,
    verify_record,
)
from engine.store import sync
from engine.store.mapped_file import PAGE_BYTES, MappedFile, MappedFileQueue, create_preallocated, prefetch

log = logging.getLogger(__name__)

COMMIT_LOG_DIR = "commitlog"
# V1 and V2 magics share their first three bytes: one search finds both.
_MAGIC_PATTERNS = (MAGIC_V1.to_bytes(4, "big")[:3], MAGIC_BLANK.to_bytes(4, "big"))


class LogSettings(Protocol):
    """What a reader takes from the engine's settings (``engine.config.StoreConfig`` has both):
    the store's objects are given numbers, and never import the config."""

    @property
    def segment_size_bytes(self) -> int: ...
    @property
    def record_crc_enabled(self) -> bool: ...


class CommitLogReader:
    """Read-only access to the CommitLog through this process's own mappings."""

    def __init__(self, store_dir: Path, segment_size_bytes: int, *, require_record_crc: bool | None = None) -> None:
        """``require_record_crc``: None decides from the log's first record (a store written by a
        RocketMQ broker has no record CRCs; one written here has them on every record)."""
        self.segments = MappedFileQueue(store_dir / COMMIT_LOG_DIR, segment_size_bytes, writable=False)
        self.segment_size_bytes = segment_size_bytes
        self._require_record_crc = require_record_crc
        self._last: MappedFile | None = None  # the segment read last: pulls read runs of records

    @classmethod
    def for_config(cls, store_dir: Path, config: LogSettings) -> CommitLogReader:
        """A reader for an engine's store: with record CRCs off, never demand them."""
        return cls(store_dir, config.segment_size_bytes,
                   require_record_crc=None if config.record_crc_enabled else False)

    @property
    def require_record_crc(self) -> bool:
        if self._require_record_crc is None:
            first = self.segments.first_offset()
            segment = self.segments.get(first) if first is not None else None
            if first is None or segment is None:
                return False  # nothing written yet: decide when there is
            try:
                record = decode_record(segment.mm, 0, limit=segment.size_bytes, base_offset=first, check_crc=False)
            except RecordError:
                return False
            tail = bytes(record.properties_raw[-CRC32_RESERVED_BYTES:])
            self._require_record_crc = tail.startswith(CRC32_PROPERTY_PREFIX)
        return self._require_record_crc

    def min_offset(self) -> int:
        first = self.segments.first_offset()
        return 0 if first is None else first

    def segment_at(self, offset: int) -> MappedFile | None:
        return self.segments.find(offset)

    def _holding(self, offset: int) -> MappedFile:
        """The segment holding ``offset`` (the one read last, as pulls read runs of records)."""
        segment = self._last
        if segment is None or not segment.start_offset <= offset < segment.end_offset or segment.mm.closed:
            segment = self._last = self.segments.find(offset)
        if segment is None:
            raise RecordError("no segment holds this offset", offset)
        return segment

    def read(self, offset: int, *, limit: int, check_crc: bool = True) -> Record:
        """The record at ``offset``; RecordError if it is damaged or reaches past ``limit``."""
        segment = self._holding(offset)
        end = min(segment.size_bytes, limit - segment.start_offset)
        return decode_record(segment.mm, offset - segment.start_offset, limit=end,
                             base_offset=segment.start_offset, check_crc=check_crc,
                             require_record_crc=check_crc and self.require_record_crc)

    def read_head(self, offset: int, *, limit: int) -> RecordHead:
        """The head of the record at ``offset``, every check done but no properties decoded."""
        segment = self._holding(offset)
        end = min(segment.size_bytes, limit - segment.start_offset)
        return verify_record(segment.mm, offset - segment.start_offset, limit=end, base_offset=segment.start_offset,
                             require_record_crc=self.require_record_crc)

    def read_view(self, offset: int, *, limit: int, check_crc: bool = True) -> MessageMap:
        """The record at ``offset`` as a reply's message map (``codec.read_view``), every check
        done unless ``check_crc`` is off; RecordError if it is damaged or reaches past ``limit``."""
        segment = self._holding(offset)
        end = min(segment.size_bytes, limit - segment.start_offset)
        view = codec.read_view(segment.mm, offset - segment.start_offset, end, segment.start_offset, check_crc,
                               check_crc and self.require_record_crc)
        if view is None:
            self.read(offset, limit=limit, check_crc=check_crc)  # raises RecordError with the reason
            raise RecordError("record refused by the codec", offset)  # the two disagree: never serve it
        return view

    def scan_heads(self, start: int, end: int, *, tail_from: int | None = None,
                   tail_resync_bytes: int = 8 << 20) -> Iterator[RecordHead | Damage]:
        """``scan`` with every check (CRCs included) yielding only record heads: the recovery pass.

        Past ``tail_from`` (the last durable point) the search for a valid record after
        damage covers only ``tail_resync_bytes``: beyond the tail the log is mostly
        preallocated zeros, and searching a whole 1 GiB segment costs a second. Records
        further out were never flushed, which the flush mode allows a power cut to lose.
        """
        offset = start
        require = self.require_record_crc
        while offset < end:
            segment = self.segments.find(offset)
            if segment is None:
                yield Damage(offset, end, "missing segment")
                return
            mm, base = segment.mm, segment.start_offset
            limit = min(segment.size_bytes, end - base)
            pos = offset - base
            while limit - pos >= END_FILE_MIN_BLANK_BYTES:
                size, magic = peek_size_and_magic(mm, pos)
                if magic == MAGIC_BLANK and size == segment.size_bytes - pos:
                    break
                try:
                    head = verify_record(mm, pos, limit=limit, base_offset=base, require_record_crc=require)
                except RecordError as exc:
                    window = limit
                    if tail_from is not None and base + pos >= tail_from:
                        window = min(limit, pos + tail_resync_bytes)
                    resume = find_next_record(segment, pos + 1, limit, check_crc=True, require_record_crc=require,
                                              search_end=window)
                    stop = resume if resume is not None else limit
                    yield Damage(base + pos, base + stop, exc.reason)
                    pos = stop
                    continue
                yield head
                pos += head.total_size
            offset = segment.end_offset

    def past_blank_marker(self, offset: int) -> int:
        """``offset``, or the next segment's start if a blank marker there fills the rest of its segment
        (the end of a log whose last batch rolled to a segment it has not written yet)."""
        segment = self.segments.find(offset)
        if segment is None or offset == segment.start_offset:
            return offset
        pos = offset - segment.start_offset
        if segment.size_bytes - pos >= END_FILE_MIN_BLANK_BYTES:
            size, magic = peek_size_and_magic(segment.mm, pos)
            if magic == MAGIC_BLANK and size == segment.size_bytes - pos:
                return segment.end_offset
        return offset

    def scan(self, start: int, end: int, *, check_crc: bool = False) -> Iterator[ScanItem]:
        """Walk [start, end) record by record, yielding records and damaged ranges.

        Blank markers roll to the next segment. A record that fails its checks
        is reported as a ``Damage`` and the walk resynchronises on the next
        valid record (it never stops silently in the middle of the log).
        """
        offset = start
        while offset < end:
            segment = self.segments.find(offset)
            if segment is None:
                yield Damage(offset, end, "missing segment")
                return
            pos = offset - segment.start_offset
            limit = min(segment.size_bytes, end - segment.start_offset)
            if limit - pos < END_FILE_MIN_BLANK_BYTES:
                offset = segment.end_offset
                continue
            size, magic = peek_size_and_magic(segment.mm, pos)
            if magic == MAGIC_BLANK and size == segment.size_bytes - pos:
                offset = segment.end_offset
                continue
            require = check_crc and self.require_record_crc
            try:
                record = decode_record(segment.mm, pos, limit=limit, base_offset=segment.start_offset,
                                       check_crc=check_crc, require_record_crc=require)
            except RecordError as exc:
                resume = find_next_record(segment, pos + 1, limit, check_crc=check_crc, require_record_crc=require)
                stop = segment.start_offset + (resume if resume is not None else limit)
                yield Damage(offset, stop, exc.reason)
                offset = stop
                continue
            yield record
            offset += record.total_size


def _write_all(fd: int, data: memoryview, pos: int) -> None:
    while data:
        written = os.pwrite(fd, data, pos)
        data = data[written:]
        pos += written


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes [start, end) of the log that hold no valid record."""

    start: int
    end: int
    reason: str


ScanItem = Record | Damage


def find_next_record(segment: MappedFile, pos: int, limit: int, *, check_crc: bool,
                     require_record_crc: bool = False, search_end: int | None = None) -> int | None:
    """Position of the next valid record (or blank marker) in ``segment`` at or after ``pos``.

    Records must end before ``limit``; they may start before ``search_end`` (default ``limit``).
    """
    mm = segment.mm
    best: int | None = None
    search_end = limit if search_end is None else min(search_end + 4, limit)
    for pattern in _MAGIC_PATTERNS:
        at = pos + 4
        while True:
            hit = mm.find(pattern, at, search_end)
            if hit < 0 or (best is not None and hit - 4 >= best):
                break
            candidate = hit - 4
            if candidate >= pos and _is_record_at(segment, candidate, limit, check_crc=check_crc,
                                                  require_record_crc=require_record_crc):
                best = candidate
                break
            at = hit + 1
    return best


def _is_record_at(segment: MappedFile, pos: int, limit: int, *, check_crc: bool, require_record_crc: bool) -> bool:
    if pos + END_FILE_MIN_BLANK_BYTES <= segment.size_bytes:
        size, magic = peek_size_and_magic(segment.mm, pos)
        if magic == MAGIC_BLANK:
            return size == segment.size_bytes - pos
    if pos + PHYSICAL_OFFSET_POSITION + 8 > limit:
        return False
    try:
        decode_record(segment.mm, pos, limit=limit, base_offset=segment.start_offset, check_crc=check_crc,
                      require_record_crc=require_record_crc)
    except RecordError:
        return False
    return True


_GARBAGE_CHUNK_BYTES = 1 << 20


def _zero_garbage(segment: MappedFile, pos: int, *, sweep: bool) -> None:
    """Zero the non-zero bytes from ``pos``: up to the first clean chunk, or (``sweep``) to the end.

    After a power cut, stale pages can survive beyond a zeroed one; a stale
    record there would look valid to a later scan, so then the whole rest is
    read and every dirty chunk zeroed.

    The zeroed bytes are synced at once: the flusher syncs only up to the log's end,
    and with nothing appended after recovery it never syncs this segment again. The
    garbage may be on disk (a power cut left it there, or an fdatasync of the segment
    carried a killed writer's torn batch), and a power cut after the next clean stop
    would bring it back, where that stop's recovery keeps records that follow damage.
    """
    for at in range(pos, segment.size_bytes, _GARBAGE_CHUNK_BYTES):
        stop = min(segment.size_bytes, at + _GARBAGE_CHUNK_BYTES)
        if segment.mm[at:stop].strip(b"\x00"):
            segment.zero(at, stop)
            segment.flush(at, stop)
        elif not sweep:
            return


@dataclass(slots=True)
class AppendResult:
    """Where a batch landed: the commit log offset of each record, and the end of the last."""

    offsets: list[int] = field(default_factory=list)
    end_offset: int = 0

    @property
    def positions(self) -> list[tuple[int, int]]:
        """(commit_log_offset, size) per record: a batch's records lie back to back."""
        ends = [*self.offsets[1:], self.end_offset]
        return [(start, end - start) for start, end in zip(self.offsets, ends, strict=True)]


class CommitLogWriter:
    """The single appender. ``written_offset`` is where the next record goes.

    A batch is encoded into a buffer and written with one ``pwrite``, not through the
    mapping: an ``fdatasync`` then costs about a quarter as much (measured on this machine
    kind: p50 0.16 ms against 0.58 ms after writing the same bytes through a shared
    mapping, whose page-table entries the kernel must clean before writeback). Readers
    keep reading through their mappings: one page cache backs both."""

    def __init__(self, store_dir: Path, segment_size_bytes: int, *, store_host: HostAddress,
                 with_record_crc: bool, warm_segments: bool = False, background: bool = True,
                 reserve_step_bytes: int = 16 << 20) -> None:
        """``reserve_step_bytes``: segments are sparse, their blocks reserved up to this far
        ahead of the appends (``MappedFile.reserve``); ``warm_segments`` allocates them whole."""
        self.segments = MappedFileQueue(store_dir / COMMIT_LOG_DIR, segment_size_bytes, writable=True,
                                        reserve_step_bytes=None if warm_segments else reserve_step_bytes)
        self.segment_size_bytes = segment_size_bytes
        self.store_host = store_host
        self.with_record_crc = with_record_crc
        self.warm_segments = warm_segments
        self.background = background  # prepare the next segment in a thread (off in the simulation)
        self.written_offset = 0
        self._fds: dict[int, int] = {}  # segment start -> descriptor for appends
        self._scratch = bytearray()  # a batch is encoded here, then written with one pwrite
        self._preallocation: threading.Thread | None = None
        self._preallocation_error: OSError | None = None

    def open_at(self, offset: int, *, after_power_loss: bool = False) -> None:
        """Set the append position after recovery and clear any torn bytes past it.

        A killed writer leaves at most a torn batch right after the end. A power cut
        can leave stale pages anywhere after it, so then everything after it is swept.
        """
        self.written_offset = offset
        first = offset - offset % self.segment_size_bytes
        for start in self.segments.known:
            if start < first:
                continue
            segment = self.segments.get(start)
            assert segment is not None
            _zero_garbage(segment, offset - start if start == first else 0, sweep=after_power_loss)

    def batch_size(self, records: list[RecordFields]) -> int:
        store_v6 = len(self.store_host.ip) == IPV6_BYTES
        return sum(encoded_size(r, with_record_crc=self.with_record_crc, store_host_v6=store_v6) for r in records)

    def items_size(self, topic: bytes, count: int, payload_bytes: int, *,
                   born_host: HostAddress | None = None) -> int:
        """The bytes a batch of ``count`` records of ``topic`` takes, with ``payload_bytes`` of
        bodies and encoded properties in all (``layout.record_size`` summed), born at ``born_host``
        (``append_items``'s; the store host when None): an IPv6 one takes 12 bytes more a record."""
        per_record = record_size(body_bytes=0, topic_bytes=len(topic), properties_bytes=0,
                                 sys_flag=host_flags(born_host or self.store_host, self.store_host))
        if self.with_record_crc:
            per_record += CRC32_RESERVED_BYTES
        return count * per_record + payload_bytes

    def append(self, records: list[RecordFields], *, first_queue_offset: int,
               store_timestamp_ms: int) -> AppendResult:
        """Append a batch for one queue; queue offsets run from ``first_queue_offset``."""
        first = records[0]
        assert all(r.topic == first.topic and r.queue_id == first.queue_id for r in records)
        items = [(r.body, r.properties, r.flag, r.born_timestamp_ms, r.sys_flag, r.prepared_transaction_offset)
                 for r in records]
        return self.append_items(first.topic, first.queue_id, items, born_host=first.born_host,
                                 batch_bytes=self.batch_size(records), first_queue_offset=first_queue_offset,
                                 store_timestamp_ms=store_timestamp_ms)

    def append_items(self, topic: bytes, queue_id: int, items: Sequence[RecordItem], *, born_host: HostAddress,
                     batch_bytes: int, first_queue_offset: int, store_timestamp_ms: int) -> AppendResult:
        """Append ``(body, properties, flag, born_timestamp_ms)`` items (``records.build_items``)
        for one queue, ``batch_bytes`` in all; queue offsets run from ``first_queue_offset``."""
        assert batch_bytes + END_FILE_MIN_BLANK_BYTES <= self.segment_size_bytes
        segment = self._segment_for(batch_bytes)
        pos = self.written_offset - segment.start_offset
        if len(self._scratch) < batch_bytes:
            self._scratch = bytearray(batch_bytes)
        offsets, end = codec.encode_records(self._scratch, 0, segment.start_offset + pos, topic, queue_id,
                                            first_queue_offset, store_timestamp_ms, self.store_host, born_host,
                                            self.with_record_crc, items)
        assert end == batch_bytes, (end, batch_bytes)
        segment.reserve(pos + batch_bytes + END_FILE_MIN_BLANK_BYTES)  # ENOSPC here, not mid-write
        _write_all(self._fd(segment), memoryview(self._scratch)[:batch_bytes], pos)
        self.written_offset = segment.start_offset + pos + batch_bytes
        return AppendResult(offsets, self.written_offset)

    def append_raw(self, data: bytes) -> None:
        """A replica's append: bytes of its master's log at this log's end, whole records that do
        not cross a segment's end (a segment's blank tail among them: ``LogChunk``)."""
        start = self.written_offset - self.written_offset % self.segment_size_bytes
        pos = self.written_offset - start
        assert pos + len(data) <= self.segment_size_bytes, (pos, len(data))
        segment = self._segment(start)
        segment.reserve(min(self.segment_size_bytes, pos + len(data) + END_FILE_MIN_BLANK_BYTES))
        _write_all(self._fd(segment), memoryview(data), pos)
        self.written_offset += len(data)

    def reserve_for(self, batch_bytes: int) -> None:
        """Reserve the blocks an append of ``batch_bytes`` would take, appending nothing: OSError as
        ``append_items`` would give it. The writer asks again this way whether a disk that refused
        an append takes one now; what it reserves, the next appends use."""
        start = self.written_offset - self.written_offset % self.segment_size_bytes
        pos = self.written_offset - start
        remaining = self.segment_size_bytes - pos
        if batch_bytes + END_FILE_MIN_BLANK_BYTES <= remaining:
            self._segment(start).reserve(pos + batch_bytes + END_FILE_MIN_BLANK_BYTES)
            return
        if remaining >= END_FILE_MIN_BLANK_BYTES:
            self._segment(start).reserve(pos + END_FILE_MIN_BLANK_BYTES)
        self._segment(start + self.segment_size_bytes).reserve(batch_bytes + END_FILE_MIN_BLANK_BYTES)

    def _fd(self, segment: MappedFile) -> int:
        """The descriptor appends to ``segment`` go through; those of older segments are closed."""
        fd = self._fds.get(segment.start_offset)
        if fd is None:
            for start in [start for start in self._fds if start < segment.start_offset]:
                os.close(self._fds.pop(start))
            fd = self._fds[segment.start_offset] = os.open(segment.path, os.O_WRONLY)
        return fd

    def _segment_for(self, batch_bytes: int) -> MappedFile:
        """The segment that will take a batch of ``batch_bytes``, rolling if needed."""
        start = self.written_offset - self.written_offset % self.segment_size_bytes
        segment = self._segment(start)
        pos = self.written_offset - start
        remaining = self.segment_size_bytes - pos
        if batch_bytes + END_FILE_MIN_BLANK_BYTES <= remaining:
            return segment
        if remaining >= END_FILE_MIN_BLANK_BYTES:
            segment.reserve(pos + END_FILE_MIN_BLANK_BYTES)  # the marker is written through the mapping
            encode_blank(segment.mm, pos, remaining)
        self.written_offset = segment.end_offset
        return self._segment(segment.end_offset)

    def _segment(self, start: int) -> MappedFile:
        """The segment at ``start``, created now if the background preallocation has not made it.

        Only a missing segment waits for a preallocation in progress (it may be that one)."""
        segment = self.segments.get(start)
        if segment is not None:
            return segment
        self._join_preallocation()
        segment = self.segments.get(start)
        if segment is None:
            segment = self.segments.create(start, warm=self.warm_segments)
            prefetch(segment.path)
        return segment

    def ensure_segment(self) -> None:
        """Create the segment that takes the next append (at start, so the first send does not wait)."""
        self._segment(self.written_offset - self.written_offset % self.segment_size_bytes)

    def ensure_next_segment(self) -> None:
        """Start preallocating the segment after the current one in a background thread, so a
        roll never waits (RocketMQ's AllocateMappedFileService). Zeroing and syncing a warm
        1 GiB segment takes seconds; the writer keeps appending meanwhile (the thread only
        does file I/O, which releases the GIL)."""
        if self._preallocation is not None:
            if self._preallocation.is_alive():
                return
            self._join_preallocation()
        start = self.written_offset - self.written_offset % self.segment_size_bytes
        nxt = start + self.segment_size_bytes
        if self.segments.get(nxt) is not None:
            return
        path = self.segments.directory / offset_to_file_name(nxt)
        if not self.background:
            self._preallocate(path)
            self._preallocation_error = None  # a roll creates it again, and reports the error then
            return
        self._preallocation = threading.Thread(target=self._preallocate, args=(path,), daemon=True,
                                               name="segment-preallocation")
        self._preallocation.start()

    def next_segment_ready(self) -> bool:
        """The segment after the current one exists (``ensure_next_segment`` made it)."""
        start = self.written_offset - self.written_offset % self.segment_size_bytes
        return self.segments.get(start + self.segment_size_bytes) is not None

    def _preallocate(self, path: Path) -> None:
        try:
            self.segments.directory.mkdir(parents=True, exist_ok=True)
            create_preallocated(path, self.segment_size_bytes, warm=self.warm_segments,
                                reserve_bytes=None if self.warm_segments else PAGE_BYTES)
            prefetch(path)
        except OSError as exc:
            self._preallocation_error = exc

    def _join_preallocation(self) -> None:
        """Wait for a preallocation in progress; OSError if it failed (a full disk)."""
        if self._preallocation is None:
            return
        self._preallocation.join()
        self._preallocation = None
        error, self._preallocation_error = self._preallocation_error, None
        if error is not None:
            raise error

    def flush(self, start: int, end: int) -> None:
        """Make [start, end) of the log durable: ``fdatasync`` each segment it touches.

        OSError if the disk refuses: the caller must then never acknowledge past ``start``
        (a failed flush is not retried, see the flusher)."""
        offset = start
        while offset < end:
            segment = self.segments.find(offset)
            if segment is None:
                return
            cached = self._fds.get(segment.start_offset)
            fd = cached if cached is not None else os.open(segment.path, os.O_RDONLY)
            try:
                sync.fdatasync(fd, segment.path)
            finally:
                if cached is None:
                    os.close(fd)
            offset = segment.end_offset

    def close(self) -> None:
        try:
            self._join_preallocation()
        except OSError:
            pass  # the next writer preallocates again
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self.segments.close()
