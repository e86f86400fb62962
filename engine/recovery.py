"""CommitLog recovery: find the valid end of the log and the next queue offsets.

The plan (``plan_commit_log_recovery``) is computed without changing
anything, so ``python -m engine inspect`` can print it; the writer then
applies it by opening the log at ``end_offset`` (zeroing torn bytes past it,
never shrinking a file).

Where the scan starts: every queue is complete up to the end of its last
unit (units are written in log order), and every queue is complete up to the
checkpoint's ``dispatched_offset``; so the scan starts at the smallest
``max(dispatched_offset, queue's last unit end)`` over all queues. Each valid
record after that raises its queue's next offset. Damage followed by valid
records is reported loudly and skipped, never cut (``commit_log.scan``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from engine.checkpoint import CheckpointError, load_checkpoint
from engine.commit_log import CommitLogReader, Damage
from engine.config import StoreConfig
from engine.consume_queue import ConsumeQueue, list_queues

log = logging.getLogger(__name__)


@dataclass
class CommitLogRecoveryPlan:
    scan_start: int
    end_offset: int
    min_offset: int
    next_queue_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    damage: list[Damage] = field(default_factory=list)
    records_scanned: int = 0
    bytes_scanned: int = 0
    last_store_timestamp_ms: int = 0


def queue_state(store_dir: Path, config: StoreConfig) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, queue_id) -> (next queue offset, end of the last unit's record), read-only."""
    state = {}
    for topic, queue_id in list_queues(store_dir):
        cq = ConsumeQueue(store_dir, topic, queue_id, file_units=config.consume_queue_file_units, writable=False)
        state[(topic, queue_id)] = (cq.max_offset, cq.max_physical_end)
        cq.close()
    return state


def plan_commit_log_recovery(store_dir: Path, config: StoreConfig) -> CommitLogRecoveryPlan:
    reader = CommitLogReader(store_dir, config.segment_size_bytes)
    try:
        return _plan(store_dir, config, reader)
    finally:
        reader.segments.close()


def _plan(store_dir: Path, config: StoreConfig, reader: CommitLogReader) -> CommitLogRecoveryPlan:
    first = reader.segments.first_offset()
    last = reader.segments.last_offset()
    queues = queue_state(store_dir, config)
    if first is None or last is None:
        return CommitLogRecoveryPlan(0, 0, 0, {key: nxt for key, (nxt, _end) in queues.items()})
    try:
        checkpoint = load_checkpoint(store_dir)
    except CheckpointError as exc:
        log.error("checkpoint unusable (%s); scanning the whole log", exc)
        checkpoint = None
    dispatched = checkpoint.dispatched_offset if checkpoint else 0
    start = min((max(dispatched, end) for _nxt, end in queues.values()), default=dispatched)
    start = max(first, start)
    log_end = last + config.segment_size_bytes
    plan = _scan(reader, start, log_end)
    if start > first and plan.records_scanned == 0 and plan.damage and plan.damage[0].start == start:
        log.warning("no valid record at the scan start %d; scanning the whole log", start)
        plan = _scan(reader, first, log_end)
    plan.min_offset = first
    for key, (nxt, _end) in queues.items():
        plan.next_queue_offsets[key] = max(nxt, plan.next_queue_offsets.get(key, 0))
    return plan


def _scan(reader: CommitLogReader, start: int, log_end: int) -> CommitLogRecoveryPlan:
    plan = CommitLogRecoveryPlan(scan_start=start, end_offset=start, min_offset=0)
    pending: list[Damage] = []
    for item in reader.scan(start, log_end, check_crc=True):
        if isinstance(item, Damage):
            pending.append(item)
            continue
        if pending:
            plan.damage.extend(pending)
            for damage in pending:
                log.error("DAMAGED COMMIT LOG: bytes [%d, %d) hold no valid record (%s); later records are kept",
                          damage.start, damage.end, damage.reason)
            pending = []
        key = (item.topic, item.queue_id)
        plan.next_queue_offsets[key] = max(plan.next_queue_offsets.get(key, 0), item.queue_offset + 1)
        plan.end_offset = item.commit_log_offset + item.total_size
        plan.records_scanned += 1
        plan.last_store_timestamp_ms = item.store_timestamp_ms
    # A blank marker right after the last record moves the end to the next segment.
    segment = reader.segments.find(plan.end_offset)
    if segment is not None and plan.end_offset != segment.start_offset:
        from engine.layout import MAGIC_BLANK, peek_size_and_magic

        pos = plan.end_offset - segment.start_offset
        if segment.size_bytes - pos >= 8:
            size, magic = peek_size_and_magic(segment.mm, pos)
            if magic == MAGIC_BLANK and size == segment.size_bytes - pos:
                plan.end_offset = segment.end_offset
    plan.bytes_scanned = plan.end_offset - start
    if pending and pending[0].reason != "bad magic":
        log.warning("torn tail cut at commit log offset %d (%s)", pending[0].start, pending[0].reason)
    return plan
