"""Retention: which CommitLog segments to delete, and when sends must be refused.

RocketMQ's CleanCommitLogService, as a pure decision over facts the writer
gathers (``plan_deletions``):

* a segment expires ``file_reserved_time_hours`` after it was last written;
* expired segments are deleted at the configured hours (``delete_when_hours``,
  e.g. ``"04"`` or ``"03;04"``; ``"*"`` is every hour), or at any hour when the
  disk is fuller than ``disk_max_used_space_ratio``;
* above ``disk_space_clean_forcibly_ratio`` the oldest segments go even if not
  expired; above ``disk_space_warning_level_ratio`` sends are refused
  (DISK_FULL) until space is back;
* oldest first, never a hole, never the segment being written, at most
  ``delete_segment_count_max`` per round.

Deleting a file that others have mapped is safe (the mappings stay valid until
they are closed); readers learn the new minimum offset from the writer.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from engine.config import StoreConfig


@dataclass(frozen=True)
class SegmentFact:
    start_offset: int
    last_modified_s: float


@dataclass(frozen=True)
class RetentionDecision:
    delete: list[int]  # segment start offsets, oldest first
    refuse_sends: bool
    disk_used_ratio: float


def disk_used_ratio(path: Path) -> float:
    usage = shutil.disk_usage(path)
    return usage.used / usage.total if usage.total else 0.0


def is_delete_hour(config: StoreConfig, now_s: float) -> bool:
    hours = {h.strip() for h in config.delete_when_hours.split(";")}
    return "*" in hours or time.strftime("%H", time.localtime(now_s)) in hours


def plan_deletions(config: StoreConfig, segments: list[SegmentFact], *, active_start: int, now_s: float,
                   used_ratio: float) -> RetentionDecision:
    forcibly = used_ratio > config.disk_space_clean_forcibly_ratio
    space_pressure = used_ratio > config.disk_max_used_space_ratio
    time_to_delete = is_delete_hour(config, now_s) or space_pressure or forcibly
    reserved_s = config.file_reserved_time_hours * 3600
    delete: list[int] = []
    if time_to_delete:
        for segment in segments:  # oldest first; stop at the first one that stays
            if segment.start_offset >= active_start or len(delete) >= config.delete_segment_count_max:
                break
            expired = segment.last_modified_s + reserved_s <= now_s
            if not (expired or forcibly):
                break
            delete.append(segment.start_offset)
    return RetentionDecision(delete, used_ratio > config.disk_space_warning_level_ratio, used_ratio)
