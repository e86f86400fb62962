"""Which CommitLog segments a scan must read: one partition per segment, minus those pruned.

Two kinds of evidence let a segment be skipped without reading it:

* **time**: store timestamps never decrease along the log of this engine (the
  writer stores ``max(now, last)``, across restarts too), so every record of
  segment i was stored between the first record of segment i and the first
  record of segment i+1. A broker takes its store time under its put lock,
  but from a clock that can step back: for stores not written here a second
  of slack is added.
* **queues**: below the store's ``dispatched_end`` every record has its
  ConsumeQueue unit, so the segments holding records of the selected queues
  are exactly those their units point into. Units of a queue are in log
  order, so a bisection finds each segment change in O(log n) unit reads.
  Segments at or past ``dispatched_end`` are always read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from engine.layout import (
    MAGIC_V1,
    MAGIC_V2,
    RECORD_HEADER,
    SYS_FLAG,
    SYS_FLAG_POSITION,
    SYSFLAG_HOSTS_V6,
    record_header,
)
from engine.spark.record_filter import RecordFilter
from engine.spark.store_view import StoreSnapshot
from engine.store.commit_log import COMMIT_LOG_DIR
from engine.store.consume_queue import ConsumeQueue, Unit, list_queues
from engine.store.mapped_file import list_files

FOREIGN_TIME_SLACK_MS = 1000


@dataclass(frozen=True)
class SegmentRange:
    start: int  # the segment's first commit log offset
    end: int  # where reading stops: the segment's end, or the snapshot's read_end
    last: bool  # the newest segment: zeros after its last record are the unwritten rest


def plan_segments(snapshot: StoreSnapshot, wanted: RecordFilter, *, use_consume_queue: bool) -> list[SegmentRange]:
    """The segments to scan for ``wanted``, oldest first."""
    size = snapshot.segment_size_bytes
    starts = [start for start, _path in list_files(snapshot.path / COMMIT_LOG_DIR)]
    ranges = [SegmentRange(s, snapshot.limit_for(s + size), i == len(starts) - 1) for i, s in enumerate(starts)]
    ranges = [r for r in ranges if r.end > r.start]
    if wanted.empty:
        return []
    if wanted.start_ms is not None or wanted.end_ms is not None:
        ranges = _prune_by_time(snapshot, ranges, starts, wanted)
    if use_consume_queue and (wanted.topics is not None or wanted.queue_ids is not None):
        ranges = _prune_by_queues(snapshot, ranges, wanted)
    return ranges


def first_store_timestamp(snapshot: StoreSnapshot, start: int) -> int | None:
    """Store time of the record at the start of a segment, None if it does not start with one."""
    path = snapshot.path / COMMIT_LOG_DIR / f"{start:020d}"
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        head = os.pread(fd, record_header(SYSFLAG_HOSTS_V6).size, 0)
    finally:
        os.close(fd)
    if len(head) < RECORD_HEADER.size:
        return None
    header = record_header(SYS_FLAG.unpack_from(head, SYS_FLAG_POSITION)[0])
    if len(head) < header.size:
        return None
    fields = header.unpack_from(head)
    magic, physical_offset = fields[1], fields[6]
    store_timestamp: int = fields[11]
    if magic not in (MAGIC_V1, MAGIC_V2) or physical_offset != start:
        return None
    return store_timestamp


def _prune_by_time(snapshot: StoreSnapshot, ranges: list[SegmentRange], starts: list[int],
                   wanted: RecordFilter) -> list[SegmentRange]:
    firsts = {s: first_store_timestamp(snapshot, s) for s in starts}
    following = dict(zip(starts, [*starts[1:], None], strict=True))
    slack = 0 if snapshot.ours else FOREIGN_TIME_SLACK_MS
    kept = []
    for r in ranges:
        lowest = firsts[r.start]
        nxt = following[r.start]
        highest = firsts[nxt] if nxt is not None else None
        if highest is not None and wanted.start_ms is not None and highest + slack < wanted.start_ms:
            continue  # everything here was stored before the range starts
        if lowest is not None and wanted.end_ms is not None and lowest - slack >= wanted.end_ms:
            continue  # everything here was stored after the range ends
        kept.append(r)
    return kept


def _prune_by_queues(snapshot: StoreSnapshot, ranges: list[SegmentRange], wanted: RecordFilter) -> list[SegmentRange]:
    size = snapshot.segment_size_bytes
    queues = list_queues(snapshot.path)
    covered = snapshot.dispatched_end if snapshot.dispatched_end is not None else _highest_unit_end(snapshot, queues)
    touched: set[int] = set()
    for topic, queue_id in queues:
        if (wanted.topics is None or topic in wanted.topics) and (wanted.queue_ids is None
                                                                   or queue_id in wanted.queue_ids):
            cq = _open(snapshot, topic, queue_id)
            try:
                touched |= touched_segments(cq, size, below=covered)
            finally:
                cq.close()
    return [r for r in ranges if r.start + size > covered or r.start in touched]


def _open(snapshot: StoreSnapshot, topic: str, queue_id: int) -> ConsumeQueue:
    return ConsumeQueue(snapshot.path, topic, queue_id, file_units=snapshot.consume_queue_file_units, writable=False)


def _highest_unit_end(snapshot: StoreSnapshot, queues: list[tuple[str, int]]) -> int:
    """The end of the record of the highest unit of any queue: a broker's dispatcher is sequential,
    so every record below it has its unit."""
    highest = 0
    for topic, queue_id in queues:
        cq = _open(snapshot, topic, queue_id)
        highest = max(highest, cq.max_physical_end)
        cq.close()
    return highest


def touched_segments(cq: ConsumeQueue, segment_size_bytes: int, *, below: int) -> set[int]:
    """Start offsets of the segments that units of ``cq`` point into, for records below ``below``."""
    found: set[int] = set()
    position, end = cq.min_offset, cq.max_offset
    for _ in range(end - position):  # at most one turn per unit; in practice one per segment
        here = _segment_from(cq, position, end, segment_size_bytes)
        if here is None or here >= below:
            break
        found.add(here)
        lo, hi = position, end  # the first unit past this segment
        while lo < hi:
            mid = (lo + hi) // 2
            at = _segment_from(cq, mid, end, segment_size_bytes)
            if at is None or at > here:
                hi = mid
            else:
                lo = mid + 1
        position = lo
    return found


def _segment_from(cq: ConsumeQueue, position: int, end: int, segment_size_bytes: int) -> int | None:
    """Segment of the first pointing unit at or after ``position`` (blank units point nowhere)."""
    while position < end:
        units: list[Unit] = cq.read(position, 64)
        if not units:
            return None
        for unit in units:
            if unit.is_plausible:
                return unit.commit_log_offset - unit.commit_log_offset % segment_size_bytes
        position += len(units)
    return None
