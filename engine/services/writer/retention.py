"""Retention: which CommitLog segments to delete, and when sends must be refused.

RocketMQ's CleanCommitLogService, as a pure decision over facts the writer
gathers (``plan_deletions``):

* a segment expires ``file_reserved_time_hours`` after it was last written;
* expired segments are deleted at the configured hours (``delete_when_hours``,
  e.g. ``"04"`` or ``"03;04"``; ``"*"`` is every hour), or at any hour when the
  disk is fuller than ``disk_max_used_space_ratio``;
* above ``disk_space_warning_level_ratio`` sends are refused (DISK_FULL) until
  space is back; unexpired segments are kept: a full disk never costs an
  acknowledged message that is within its retention time;
* only with ``disk_space_clean_forcibly`` (off by default; RocketMQ's
  behaviour) do the oldest segments go even if not expired, above
  ``disk_space_clean_forcibly_ratio``; the writer logs and counts each;
* oldest first, never a hole, never the segment being written, at most
  ``delete_segment_count_max`` per round.

Deleting a file that others have mapped is safe (the mappings stay valid until
they are closed); readers learn the new minimum offset from the writer.
"""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass
from typing import NamedTuple

from engine.config import StoreConfig
from engine.layout import END_FILE_MIN_BLANK_BYTES, MAGIC_BLANK, RecordError, decode_record, peek_size_and_magic


@dataclass(frozen=True)
class SegmentFact:
    start_offset: int
    last_modified_s: float


@dataclass(frozen=True)
class RetentionDecision:
    delete: list[int]  # segment start offsets, oldest first
    refuse_sends: bool
    disk_used_ratio: float
    forced: frozenset[int] = frozenset()  # those of ``delete`` that had not expired


def is_delete_hour(config: StoreConfig, now_s: float) -> bool:
    hours = {h.strip() for h in config.delete_when_hours.split(";")}
    return "*" in hours or time.strftime("%H", time.localtime(now_s)) in hours


def plan_deletions(config: StoreConfig, segments: list[SegmentFact], *, active_start: int, now_s: float,
                   used_ratio: float) -> RetentionDecision:
    forcibly = config.disk_space_clean_forcibly and used_ratio > config.disk_space_clean_forcibly_ratio
    space_pressure = used_ratio > config.disk_max_used_space_ratio
    time_to_delete = is_delete_hour(config, now_s) or space_pressure or forcibly
    reserved_s = config.file_reserved_time_hours * 3600
    delete: list[int] = []
    forced: set[int] = set()
    if time_to_delete:
        for segment in segments:  # oldest first; stop at the first one that stays
            if segment.start_offset >= active_start or len(delete) >= config.delete_segment_count_max:
                break
            expired = segment.last_modified_s + reserved_s <= now_s
            if not (expired or forcibly):
                break
            delete.append(segment.start_offset)
            if not expired:
                forced.add(segment.start_offset)
    return RetentionDecision(delete, used_ratio > config.disk_space_warning_level_ratio, used_ratio,
                             frozenset(forced))


class SegmentSummary(NamedTuple):
    """What a forced deletion took: for the log line and the writer's counters."""

    messages: int
    first_store_timestamp_ms: int  # 0 when the segment held no record
    last_store_timestamp_ms: int
    complete: bool  # False: a damaged record stopped the count


def summarize_segment(fd: int, start_offset: int) -> SegmentSummary:
    """Count the records of an open segment file and read its first and last store times.

    ``start_offset`` is the segment's first commit log offset. Walks the records by
    their sizes (no CRC checks) and decodes only the first and the last; the caller
    runs it off its loop (a 1 GiB segment of small records takes about a second)
    and closes ``fd``.
    """
    size_bytes = os.fstat(fd).st_size
    if size_bytes == 0:
        return SegmentSummary(0, 0, 0, True)
    with mmap.mmap(fd, size_bytes, prot=mmap.PROT_READ) as mm:
        pos, last, count = 0, -1, 0
        while size_bytes - pos >= END_FILE_MIN_BLANK_BYTES:
            size, magic = peek_size_and_magic(mm, pos)
            if magic == MAGIC_BLANK or size <= END_FILE_MIN_BLANK_BYTES or pos + size > size_bytes:
                break
            last, count, pos = pos, count + 1, pos + size
        ended = size_bytes - pos < END_FILE_MIN_BLANK_BYTES or peek_size_and_magic(mm, pos) in {(0, 0)} \
            or peek_size_and_magic(mm, pos)[1] == MAGIC_BLANK
        if not count:
            return SegmentSummary(0, 0, 0, ended)
        try:
            first_ms, last_ms = (decode_record(mm, at, limit=size_bytes, base_offset=start_offset,
                                               check_crc=False).store_timestamp_ms for at in (0, last))
        except RecordError:
            return SegmentSummary(count, 0, 0, False)
        return SegmentSummary(count, first_ms, last_ms, ended)
