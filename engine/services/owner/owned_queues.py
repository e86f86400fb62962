"""The ConsumeQueues one owner holds, kept equal to the log.

Owner k holds every (topic, queue_id) with ``owner_of(topic, queue_id) == k``. This
object writes their units: from dispatch batches, or straight from the log when a
batch was missed or after a restart (catch-up), rebuilds units a pull found damaged
(healing), drops the queues of deleted topics and the files retention passed. It
knows nothing of sockets or clients: the owner actor serves pulls over it.

Progress: ``applied_offset``, the log offset below which every record of these
queues is in a unit.
"""

from __future__ import annotations

import logging
from pathlib import Path

from engine import codec
from engine.config import StoreConfig
from engine.ipc.messages import DispatchBatch
from engine.layout import RecordError
from engine.services.log_slices import read_slice
from engine.services.restart_points import QueueTail, owner_restart, owner_restart_unclean
from engine.store.commit_log import CommitLogReader, Damage
from engine.store.consume_queue import ConsumeQueue, Unit, list_queues
from engine.store.deleted_topics import DeletedTopics
from engine.store.mapped_file import list_files
from engine.store.records import owner_of

log = logging.getLogger(__name__)
_HEAL_LOOKBACK_UNITS = 1000

QueueKey = tuple[str, int]


class OwnedQueues:
    def __init__(self, store_dir: Path, config: StoreConfig, instance: int) -> None:
        self.store_dir = store_dir
        self.config = config
        self.instance = instance
        self.owner_count = config.consume_queue_owner_count
        self.reader = CommitLogReader.for_config(store_dir, config)
        self.queues: dict[QueueKey, ConsumeQueue] = {}
        self.applied_offset = 0
        self.stalled = False  # a unit could not be written (disk full); retried on every tick
        self.behind = False  # catch-up stopped at its per-call budget: the caller goes on with it
        self.unhealable: set[tuple[str, int, int]] = set()
        self.deleted_topics = DeletedTopics(store_dir)
        self.log_min_offset = 0

    def is_mine(self, topic: str, queue_id: int) -> bool:
        return owner_of(topic, queue_id, self.owner_count) == self.instance

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def _open(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            cq = ConsumeQueue(self.store_dir, topic, queue_id, file_units=self.config.consume_queue_file_units,
                              writable=True, reserve_step_bytes=self.config.consume_queue_reserve_step_bytes)
            self.queues[(topic, queue_id)] = cq
        return cq

    # -- recovery -------------------------------------------------------------------------------

    def restart(self, *, deletions: int, dispatched: int, confirmed: int, unclean: bool = False) -> None:
        """Open our queues, repair their tails and set the applied offset to the restart point.

        After an unclean stop a power cut may have lost units anywhere past the durable point, in
        any queue, even all of a queue's (which then looks like a leftover and goes): every queue
        is cut back to its units below the checkpoint's dispatched offset, and the log applied
        again from there (``owner_restart_unclean``)."""
        self.deleted_topics.follow(deletions)
        for topic, queue_id in list_queues(self.store_dir):
            if self.is_mine(topic, queue_id):
                cq = self._open(topic, queue_id)
                if self.deleted_topics.is_leftover(cq):  # the topic was deleted before we removed it
                    self.drop_queue(cq)
        self.log_min_offset = self.reader.min_offset()
        for cq in self.queues.values():  # retention may have removed segments since the queue was written
            cq.drop_before(self.log_min_offset)
        if unclean:
            for cq in self.queues.values():
                self.cut_back(cq, min(dispatched, confirmed))
            self.applied_offset = owner_restart_unclean(dispatched=dispatched, log_min=self.log_min_offset,
                                                        confirmed=confirmed)
            return
        tails = []
        for cq in self.queues.values():
            dropped = self.repair_tail(cq, confirmed)  # first: it moves the queue's end
            tails.append(QueueTail(cq.max_physical_end, dropped))
        self.applied_offset = owner_restart(tails, dispatched=dispatched, log_min=self.log_min_offset,
                                            confirmed=confirmed)

    def cut_back(self, cq: ConsumeQueue, durable: int) -> None:
        """Drop the units from the last one that points at its own record ending at or below
        ``durable`` on (I1: all before it were flushed); the log gives the rest again."""
        keep = cq.max_offset
        while keep > cq.min_offset:
            unit = cq.get(keep - 1)
            if unit is not None and unit.is_plausible and unit.commit_log_offset + unit.size <= durable \
                    and self._unit_matches(cq, keep - 1, unit, limit=durable):
                break
            keep -= 1
        if keep < cq.max_offset:
            log.warning("queue %s/%d: units from %d on may not have reached the disk; dropped", cq.topic,
                        cq.queue_id, keep)
            cq.truncate_from(keep)

    def repair_tail(self, cq: ConsumeQueue, confirmed: int) -> bool:
        """Drop trailing units that do not point at their own record below ``confirmed``; True if any."""
        dropped = False
        for _ in range(cq.max_offset - cq.min_offset):
            queue_offset = cq.max_offset - 1
            unit = cq.get(queue_offset)
            if unit is None or unit.is_blank:
                return dropped
            if self._unit_matches(cq, queue_offset, unit, limit=confirmed):
                return dropped
            log.warning("queue %s/%d: unit %d does not match the log; dropped", cq.topic, cq.queue_id, queue_offset)
            cq.truncate_from(queue_offset)
            dropped = True
        return dropped

    def recent_files(self) -> list[Path]:
        """The last two files of every queue: what a killed predecessor may have left unflushed."""
        return [path for cq in self.queues.values() for _start, path in list_files(cq.files.directory)[-2:]]

    # -- applying the log -----------------------------------------------------------------------

    def apply_batch(self, batch: DispatchBatch) -> set[QueueKey]:
        """Apply a dispatch batch (reading a missed range from the log first); the queues it touched."""
        if batch.end <= self.applied_offset:
            return set()
        touched: set[QueueKey] = set()
        if batch.start > self.applied_offset:
            if self.behind:
                return touched  # the backlog's catch-up reads this batch's records from the log
            log.info("owner %d missed [%d, %d); reading it from the log", self.instance, self.applied_offset,
                     batch.start)
            touched = self.catch_up(batch.start)
        if self.stalled or self.behind:
            return touched  # the tick (or the next turn) goes on from the record it reached
        # The units that are their queue's next one in its window are written by the C codec over
        # the packed entries; it stops at the first entry it leaves to ConsumeQueue.put (a new
        # queue or file, a gap, a replay, a deleted topic's record), which is unpacked and put
        # here before it goes on.
        packed, written, pos = batch.packed, set[ConsumeQueue](), 0
        try:
            while (pos := codec.cq_put_packed(packed, pos, self.applied_offset, self.queues, written)) < len(packed):
                (topic, queue_id, queue_offset, commit_log_offset, size, code, _ts, _keys), pos = \
                    codec.unpack_entry(packed, pos)
                if not self.apply(topic, queue_id, queue_offset, commit_log_offset, size, code):
                    return touched
                touched.add((topic, queue_id))
        finally:
            touched.update((cq.topic, cq.queue_id) for cq in written)
        self.applied_offset = batch.end
        return touched

    def catch_up(self, end: int) -> set[QueueKey]:
        """Apply every record of our queues in [applied_offset, end) straight from the log.

        At most ``catch_up_bytes_per_turn_max`` of log a call: past it, ``behind`` is set
        and the caller calls again until ``end``. Returns the queues it touched."""
        start = self.applied_offset
        self.behind = False
        touched: set[QueueKey] = set()
        if end <= start:
            return touched
        piece = read_slice(self.reader, start, end, self.config.catch_up_bytes_per_turn_max, self.owner_count)
        for topic, queue_id, queue_offset, commit_log_offset, size, code, _ts, _keys in piece.per_owner[self.instance]:
            if not self.apply(topic, queue_id, queue_offset, commit_log_offset, size, code):
                return touched
            touched.add((topic, queue_id))
        self.applied_offset, self.behind = piece.end, piece.end < end
        return touched

    def apply(self, topic: str, queue_id: int, queue_offset: int, commit_log_offset: int, size: int,
              code: int) -> bool:
        """Write one unit; on a full disk stop at this record (False) and retry from it later."""
        if self.deleted_topics and self.deleted_topics.hides(topic, commit_log_offset):
            return True
        try:
            self._open(topic, queue_id).put(queue_offset, commit_log_offset, size, code)
        except OSError as exc:
            if not self.stalled:
                log.error("cannot extend queue %s/%d: %s; retrying from offset %d", topic, queue_id, exc,
                          commit_log_offset)
            self.stalled = True
            self.applied_offset = commit_log_offset
            return False
        self.stalled = False
        return True

    # -- healing, deletions, retention, flushing ------------------------------------------------

    def heal(self, cq: ConsumeQueue, queue_offset: int, *, visible_end: int) -> bool:
        """Rebuild units from ``queue_offset`` on from the log; True if any unit changed.

        Starts after the nearest earlier unit that still leads to its own record (or at the
        start of the log), and rewrites every unit of this queue that differs from what the
        log says. A damaged record (not a unit) cannot be healed: it is remembered, so that
        pulls do not scan for it again."""
        key = (cq.topic, cq.queue_id, queue_offset)
        if key in self.unhealable:
            return False
        start = self.reader.min_offset()
        for earlier in range(queue_offset - 1, max(cq.min_offset, queue_offset - _HEAL_LOOKBACK_UNITS) - 1, -1):
            unit = cq.get(earlier)
            if unit is not None and unit.is_plausible and self._unit_matches(cq, earlier, unit, limit=visible_end):
                start = unit.commit_log_offset + unit.size
                break
        changed = 0
        for item in self.reader.scan(start, self.applied_offset, check_crc=False):
            if isinstance(item, Damage) or (item.topic, item.queue_id) != (cq.topic, cq.queue_id) \
                    or self.deleted_topics.hides(item.topic, item.commit_log_offset):
                continue
            if queue_offset <= item.queue_offset < cq.max_offset:
                rebuilt = (item.commit_log_offset, item.total_size, codec.tags_code(item.tags))
                if tuple(cq.get(item.queue_offset) or ()) != rebuilt:
                    cq.overwrite(item.queue_offset, *rebuilt)
                    changed += 1
        log.error("queue %s/%d: damaged unit at %d; rebuilt %d units from the log from offset %d", cq.topic,
                  cq.queue_id, queue_offset, changed, start)
        if not changed:
            self.unhealable.add(key)
        return changed > 0

    def _unit_matches(self, cq: ConsumeQueue, queue_offset: int, unit: Unit, *, limit: int) -> bool:
        try:
            record = self.reader.read(unit.commit_log_offset, limit=limit, check_crc=False)
        except RecordError:
            return False
        return (record.topic, record.queue_id, record.queue_offset, record.total_size) == \
            (cq.topic, cq.queue_id, queue_offset, unit.size)

    def drop_queue(self, cq: ConsumeQueue) -> None:
        del self.queues[(cq.topic, cq.queue_id)]
        cq.destroy()
        log.info("queue %s/%d removed: its topic was deleted", cq.topic, cq.queue_id)

    def follow_deletions(self, deletions: int) -> set[str]:
        """The writer recorded a topic deletion (the count moved): drop that topic's queues.

        Every unit they hold points below the deletion offset: the writer bumps the count before
        it appends past it, and this runs before each dispatch batch is applied and before each
        catch-up slice (with the slice's end read first)."""
        changed = self.deleted_topics.follow(deletions)
        for cq in [cq for (topic, _queue_id), cq in self.queues.items() if topic in changed]:
            self.drop_queue(cq)
        return set(changed)

    def follow_retention(self, log_min: int) -> None:
        """The writer deleted old segments: forget their mappings, drop units that point only there."""
        if log_min <= self.log_min_offset:
            return
        self.log_min_offset = log_min
        self.reader.segments.refresh()
        deleted = sum(cq.drop_before(log_min) for cq in self.queues.values())
        log.info("retention: log starts at %d; %d queue files deleted", log_min, deleted)

    def unsynced_files(self) -> list[Path]:
        """The files written since the last call: what the next flush must cover."""
        return [path for cq in self.queues.values() for path in cq.take_unsynced()]

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
