"""CommitLog recovery: find the valid end of the log and the next queue offsets.

The plan (``plan_commit_log_recovery``) is computed without changing
anything, so ``python -m engine inspect`` can print it; the writer then
applies it by opening the log at ``end_offset`` (zeroing torn bytes past it,
never shrinking a file).

Where the scan starts (``restart_points.commit_log_scan_start``): early enough
to find every queue's next offset, and no later than the checkpoint's
``flushed_offset``, so it never starts past what a power cut could have lost. Each valid record after that raises its
queue's next offset; a queue whose units point past the recovered end (they
outlived the log in a power cut) counts only the units below it. Damage
followed by valid records is reported loudly and skipped, never cut
(``commit_log.scan``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import StoreConfig
from engine.services.restart_points import commit_log_scan_start, dispatched_on_disk
from engine.store.checkpoint import CheckpointError, load_checkpoint
from engine.store.commit_log import CommitLogReader, Damage
from engine.store.consume_queue import ConsumeQueue, list_queues
from engine.store.deleted_topics import DeletedTopics

log = logging.getLogger(__name__)


@dataclass
class CommitLogRecoveryPlan:
    scan_start: int
    end_offset: int
    min_offset: int
    next_queue_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    damage: list[Damage] = field(default_factory=list)
    torn_tail: Damage | None = None
    records_scanned: int = 0
    bytes_scanned: int = 0
    last_store_timestamp_ms: int = 0


def queue_state(store_dir: Path, config: StoreConfig,
                deleted: DeletedTopics | None = None) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, queue_id) -> (next queue offset, end of the last unit's record), read-only.

    A queue of a deleted topic whose units point below the deletion is left out: its owner
    had not removed it yet when the engine stopped, and will."""
    state = {}
    for topic, queue_id in list_queues(store_dir):
        cq = ConsumeQueue(store_dir, topic, queue_id, file_units=config.consume_queue_file_units, writable=False)
        if not (deleted and deleted.is_leftover(cq)):
            state[(topic, queue_id)] = (cq.max_offset, cq.max_physical_end)
        cq.close()
    return state


def units_below(store_dir: Path, config: StoreConfig, topic: str, queue_id: int, end_offset: int) -> int:
    """How many leading units of a queue point at records that end at or before ``end_offset``.

    A unit a power cut zeroed (or tore) is not below the end: counted, it would hand new records
    queue offsets past a gap, and the owners would fill the gap with holes. Counting too few is
    harmless: the plan takes the greater of this and the next offset the log scan finds."""
    cq = ConsumeQueue(store_dir, topic, queue_id, file_units=config.consume_queue_file_units, writable=False)

    def record_end(queue_offset: int) -> int | None:
        for probe in range(queue_offset, cq.max_offset):  # blank units carry no offset: look past them
            unit = cq.get(probe)
            if unit is None or unit.is_blank:
                continue
            return unit.commit_log_offset + unit.size if unit.is_plausible else None
        return None

    try:
        lo, hi = cq.min_offset, cq.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            end = record_end(mid)
            if end is None or end > end_offset:
                hi = mid
            else:
                lo = mid + 1
        return lo
    finally:
        cq.close()


def plan_commit_log_recovery(store_dir: Path, config: StoreConfig, *, unclean: bool = False) -> CommitLogRecoveryPlan:
    """``unclean``: the engine did not stop cleanly (a power cut may have torn unflushed pages)."""
    reader = CommitLogReader.for_config(store_dir, config)
    try:
        return _plan(store_dir, config, reader, unclean=unclean)
    finally:
        reader.segments.close()


def _plan(store_dir: Path, config: StoreConfig, reader: CommitLogReader, *, unclean: bool) -> CommitLogRecoveryPlan:
    first = reader.segments.first_offset()
    last = reader.segments.last_offset()
    deleted = DeletedTopics(store_dir)
    queues = queue_state(store_dir, config, deleted)
    if first is None or last is None:
        return CommitLogRecoveryPlan(0, 0, 0, {key: nxt for key, (nxt, _end) in queues.items()})
    try:
        checkpoint = load_checkpoint(store_dir)
    except CheckpointError as exc:
        log.error("checkpoint unusable (%s); scanning the whole log", exc)
        checkpoint = None
    dispatched = checkpoint.dispatched_offset if checkpoint else 0
    if dispatched_on_disk(dispatched, queues_on_disk=len(list_queues(store_dir)), log_min=first) < dispatched:
        log.warning("no ConsumeQueue on disk, while the checkpoint says the log was dispatched up to %d: "
                    "scanning the log from %d for every queue's next offset", dispatched, first)
        dispatched = first
    durable = checkpoint.flushed_offset if checkpoint else 0
    start = commit_log_scan_start(log_min=first, dispatched=dispatched, flushed=durable)
    # After an unclean stop, damage past what the checkpoint says was flushed (anywhere, without
    # one) is the mark of a power cut: flushed pages survive one. After a clean stop it can only
    # be a damaged disk, and the records after it are kept.
    torn_from = durable if unclean else None
    plan = _scan(reader, start, last + config.segment_size_bytes, durable, deleted, torn_from)
    plan.min_offset = first
    if checkpoint is not None:  # the scan may find no record: store times go on from the last flushed
        plan.last_store_timestamp_ms = max(plan.last_store_timestamp_ms, checkpoint.physic_msg_timestamp_ms)
    for (topic, queue_id), (queue_next, end) in queues.items():
        nxt = queue_next
        if end > plan.end_offset:
            log.warning("queue %s/%d points past the recovered log end %d; counting only the units below it",
                        topic, queue_id, plan.end_offset)
            nxt = units_below(reader.segments.directory.parent, config, topic, queue_id, plan.end_offset)
        key = (topic, queue_id)
        plan.next_queue_offsets[key] = max(nxt, plan.next_queue_offsets.get(key, 0))
    return plan


def _scan(reader: CommitLogReader, start: int, log_end: int, durable: int, deleted: DeletedTopics,
          torn_from: int | None) -> CommitLogRecoveryPlan:
    """Walk the log from ``start``; damage followed by valid records is skipped and reported.

    Damage with nothing valid after it is a torn tail when it starts at or past
    ``durable`` (cut: those bytes were never flushed); below ``durable`` it was
    durable data, so the log keeps its length up to ``durable`` and the damage
    stays visible (NATS lost acknowledged data by cutting here).
    """
    plan = CommitLogRecoveryPlan(scan_start=start, end_offset=start, min_offset=0)
    pending: list[Damage] = []
    for item in reader.scan_heads(start, log_end, tail_from=durable):
        if isinstance(item, Damage):
            pending.append(item)
            continue
        if pending and torn_from is not None and pending[0].start >= torn_from:
            # Unflushed bytes a power cut tore in the middle: what follows was never flushed
            # either, and keeping it would leave holes in its queues. The log ends here.
            log.warning("unflushed records after damage at %d (%s) are dropped with it",
                        pending[0].start, pending[0].reason)
            break
        _report(plan, pending)
        pending = []
        if not (deleted and deleted.hides(item.topic, item.commit_log_offset)):
            key = (item.topic, item.queue_id)
            plan.next_queue_offsets[key] = max(plan.next_queue_offsets.get(key, 0), item.queue_offset + 1)
        plan.end_offset = item.commit_log_offset + item.total_size
        plan.records_scanned += 1
        plan.last_store_timestamp_ms = max(plan.last_store_timestamp_ms, item.store_timestamp_ms)
    if pending and pending[0].start < durable:
        _report(plan, pending)
        plan.end_offset = max(plan.end_offset, durable)
    elif pending:
        plan.torn_tail = pending[0]
    _skip_blank_marker(reader, plan)
    plan.bytes_scanned = plan.end_offset - start
    torn = plan.torn_tail
    if torn is not None and _holds_bytes(reader, torn):
        log.warning("torn tail cut at commit log offset %d (%s)", torn.start, torn.reason)
    return plan


def _report(plan: CommitLogRecoveryPlan, damages: list[Damage]) -> None:
    plan.damage.extend(damages)
    for damage in damages:
        log.error("DAMAGED COMMIT LOG: bytes [%d, %d) hold no valid record (%s); later records are kept",
                  damage.start, damage.end, damage.reason)


def _holds_bytes(reader: CommitLogReader, damage: Damage) -> bool:
    segment = reader.segment_at(damage.start)
    if segment is None:
        return False
    pos = damage.start - segment.start_offset
    return bool(segment.mm[pos:min(segment.size_bytes, pos + 4096)].strip(b"\x00"))


def _skip_blank_marker(reader: CommitLogReader, plan: CommitLogRecoveryPlan) -> None:
    """A blank marker right after the last record moves the end to the next segment."""
    plan.end_offset = reader.past_blank_marker(plan.end_offset)
