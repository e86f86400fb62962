"""Questions about one queue answered from its units and the records they point at.

* ``queue_stats``: min and max offsets, message count, earliest and latest store times;
* ``offset_for_time``: the queue offset for a store timestamp
  (DefaultMessageStore#getOffsetInQueueByTime): ``lower`` is the first message stored
  at or after it, ``upper`` the last one stored at or before it.

Store times only grow along a queue (the writer never stores an earlier time
than the last), so a bisection over the units finds the offset in O(log n)
record reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.layout import RecordError
from engine.store.commit_log import CommitLogReader
from engine.store.consume_queue import ConsumeQueue


@dataclass
class QueueStats:
    min_offset: int = 0
    max_offset: int = 0
    message_count: int = 0
    earliest_store_timestamp: int = -1
    latest_store_timestamp: int = -1


def _store_time(cq: ConsumeQueue, reader: CommitLogReader, queue_offset: int, visible_end: int) -> int | None:
    """Store time of the record at ``queue_offset``, or None if it cannot be read (removed, damaged)."""
    unit = cq.get(queue_offset)
    if unit is None or not unit.is_plausible or unit.commit_log_offset < reader.min_offset():
        return None
    try:
        return reader.read(unit.commit_log_offset, limit=visible_end, check_crc=False).store_timestamp_ms
    except RecordError:
        return None


def queue_stats(cq: ConsumeQueue | None, reader: CommitLogReader, *, visible_end: int) -> QueueStats:
    if cq is None or cq.max_offset == 0:
        return QueueStats()
    stats = QueueStats(cq.min_offset, cq.max_offset, cq.max_offset - cq.min_offset)
    stats.earliest_store_timestamp = _store_time(cq, reader, cq.min_offset, visible_end) or -1
    stats.latest_store_timestamp = _store_time(cq, reader, cq.max_offset - 1, visible_end) or -1
    return stats


def offset_for_time(cq: ConsumeQueue | None, reader: CommitLogReader, *, timestamp_ms: int, upper: bool,
                    visible_end: int) -> int:
    """The queue offset for ``timestamp_ms``; the queue's min (lower) or max - 1 (upper) when out of range."""
    if cq is None or cq.max_offset == 0:
        return 0
    lo, hi = cq.min_offset, cq.max_offset
    while lo < hi:  # first offset whose store time is > t (upper) or >= t (lower)
        mid = (lo + hi) // 2
        stored = _store_time(cq, reader, mid, visible_end)
        if stored is None or (stored <= timestamp_ms if upper else stored < timestamp_ms):
            lo = mid + 1
        else:
            hi = mid
    if upper:
        return max(cq.min_offset, lo - 1)
    return min(lo, cq.max_offset - 1) if lo < cq.max_offset else cq.max_offset
