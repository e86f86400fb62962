"""Every pop queue index one owner holds, and one heap of invisible times over all of them.

``IndexSet`` opens each (group, topic, queue)'s ``QueueIndex`` (``queue_index.py``) once,
writes and syncs their journals, folds them, and drops those of deleted topics. A pop of
32 messages pushes one heap entry (they share their invisible time), so the timer costs
O(log n) per pop, and a tick looks only at the entries that are due: an entry whose
delivery was acked or changed since (its generation moved) is dropped when it comes up.

Called by the owner's pop glue (``engine/actors/owner_pops.py``): ``open`` for each request's
queue, ``schedule`` for each delivery, ``write`` after each request, ``sync`` before the
replies go (SYNC_FLUSH), ``expire`` and ``fold_idle`` every tick.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import ErrorCode, RequestError
from engine.services.pop.queue_index import PopKey, QueueIndex, queue_index_dir
from engine.store.disk_refusals import is_disk_refusal
from engine.store.pop_files import (
    INCARNATION_FILE,
    POP_DIR,
    SEGMENT_ENTRY_BYTES,
    SEGMENT_ENTRY_COUNT,
    SEGMENT_STATE_POSITION,
    Journal,
    State,
    read_incarnation,
    write_incarnation,
)

log = logging.getLogger(__name__)
@dataclass(order=True)
class _Expiry:
    until_ms: int
    seq: int
    queue: QueueIndex = field(compare=False)
    offsets: Sequence[int] = field(compare=False)  # a range for a pop's first deliveries: O(1) memory
    generation: int = field(compare=False, default=1)  # of every delivery in ``offsets``


class IndexSet:
    """Every ``QueueIndex`` of one owner, and the heap of their invisible times."""

    def __init__(self, store_dir: Path, *, journal_entries_max: int) -> None:
        self.store_dir = store_dir
        self.journal_entries_max = journal_entries_max
        self.queues: dict[PopKey, QueueIndex] = {}
        self.expiries: list[_Expiry] = []
        self.seq = itertools.count()
        self.written: set[QueueIndex] = set()  # journals appended to since their last sync

    def get(self, group: str, topic: str, queue_id: int) -> QueueIndex | None:
        return self.queues.get((group, topic, queue_id))

    def open(self, group: str, topic: str, queue_id: int, *, queue_end: int | None = None,
             incarnation: int = -1) -> QueueIndex:
        """The state of (group, topic, queue), recovered from its files, or new; ``incarnation``: the
        topic's deletion offset now (a new state records it, see ``pop_files.write_incarnation``)."""
        key = (group, topic, queue_id)
        queue = self.queues.get(key)
        if queue is None:
            directory = queue_index_dir(self.store_dir, group, topic, queue_id)
            try:
                if not (directory / INCARNATION_FILE).exists():
                    directory.mkdir(parents=True, exist_ok=True)
                    write_incarnation(directory, incarnation)
                journal = Journal(directory)
            except OSError as exc:  # a new queue's files on a full disk: refused, tried again by the next pop
                if not is_disk_refusal(exc):
                    raise
                log.error("pop state %s/%s/%d: cannot create its files (%s)", group, topic, queue_id, exc)
                code = ErrorCode.DISK_FULL if exc.errno in (errno.ENOSPC, errno.EDQUOT) \
                    else ErrorCode.SERVICE_NOT_AVAILABLE
                raise RequestError(code, f"the pop state could not be created ({exc.strerror}); "
                                         f"retry later") from None
            queue = self.queues[key] = QueueIndex(directory, key, journal, incarnation=read_incarnation(directory))
            queue.recover(queue_end=queue_end)
            if queue.tail_forgotten:
                self.fold(queue)  # the files must not keep what was dropped
                queue.tail_forgotten = False
            self._schedule_recovered(queue)
        return queue

    def _schedule_recovered(self, queue: QueueIndex) -> None:
        for number, segment in queue.segments.items():
            states = segment[SEGMENT_STATE_POSITION::SEGMENT_ENTRY_BYTES]
            index = states.find(State.DELIVERED)
            while index >= 0:
                offset = number * SEGMENT_ENTRY_COUNT + index
                _state, _attempt, generation, until = queue.entry(offset)
                self.schedule(queue, until, [offset], generation)
                index = states.find(State.DELIVERED, index + 1)

    def schedule(self, queue: QueueIndex, until_ms: int, offsets: Sequence[int], generation: int) -> None:
        """``offsets``, delivered with ``generation``, become due at ``until_ms``."""
        heapq.heappush(self.expiries, _Expiry(until_ms, next(self.seq), queue, offsets, generation))

    def expire(self, now_ms: int) -> set[QueueIndex]:
        """Move every delivery whose invisible time passed (and that was not acked or changed since)
        to its queue's ``due``; the queues that got some."""
        touched: set[QueueIndex] = set()
        while self.expiries and self.expiries[0].until_ms <= now_ms:
            expiry = heapq.heappop(self.expiries)
            queue = expiry.queue
            if self.queues.get(queue.key) is not queue:
                continue  # dropped with its topic
            for offset in expiry.offsets:
                state, _attempt, current, _until = queue.entry(offset)
                if state == State.DELIVERED and current == expiry.generation and offset not in queue.dead_lettering:
                    queue.due[offset] = None
                    touched.add(queue)
        return touched

    def write(self, queue: QueueIndex, now_ms: int) -> None:
        """Append the request's entries; RequestError (DISK_FULL, or SERVICE_NOT_AVAILABLE) when
        the disk refuses them. They stay pending and go with the next write: the state in
        memory is ahead of the journal meanwhile, which a crash turns into redeliveries only."""
        if not queue.pending:
            return
        try:
            queue.write(now_ms)
        except OSError as exc:
            log.error("pop journal %s: cannot append (%s); the reply says so, and the entries wait",
                      queue.journal.path, exc)
            code = ErrorCode.DISK_FULL if exc.errno in (errno.ENOSPC, errno.EDQUOT) \
                else ErrorCode.SERVICE_NOT_AVAILABLE
            raise RequestError(code, f"the pop journal could not be written ({exc.strerror}); retry later") from None
        self.written.add(queue)
        if queue.journal.entries >= self.journal_entries_max:
            self.fold(queue)

    def sync(self) -> None:
        """Every journal written to since the last sync, on disk (SYNC_FLUSH's group commit)."""
        for queue in self.written:
            queue.journal.sync()
        self.written.clear()

    def journal_paths(self) -> list[Path]:
        paths = [queue.journal.path for queue in self.written]
        for queue in self.written:
            queue.journal.unsynced = False
        self.written.clear()
        return paths

    def fold(self, queue: QueueIndex) -> None:
        """Fold the journal into the segments; a disk that refuses the segments (full) leaves the
        journal as it is, and the next fold tries again."""
        queue.journal.sync()  # a failed fdatasync stops the owner (docs/design.md 6.3)
        try:
            deleted = queue.fold()
        except OSError as exc:
            log.error("pop %s/%s/%d: fold failed (%s); the journal is kept and the fold retried", *queue.key, exc)
            return
        if deleted:
            log.info("pop %s/%s/%d: %d fully acknowledged segments deleted", *queue.key, deleted)

    def fold_idle(self, now_ms: int, idle_ms: int) -> None:
        for queue in self.queues.values():
            if queue.journal.entries and now_ms - queue.last_change_ms >= idle_ms and not queue.pending:
                self.fold(queue)

    def drop_topic(self, topic: str, is_mine: Callable[[int], bool]) -> None:
        """The topic was deleted: the state of its queues that ``is_mine`` goes with it (another
        owner's queues are its own to drop: it may already hold the state of the topic's next life)."""
        for key in [key for key in self.queues if key[1] == topic and is_mine(key[2])]:
            queue = self.queues.pop(key)
            queue.journal.close()
            self.written.discard(queue)
        for queue_dir in (self.store_dir / POP_DIR).glob(f"*/{topic}/*"):
            if queue_dir.name.isascii() and queue_dir.name.isdigit() and is_mine(int(queue_dir.name)):
                shutil.rmtree(queue_dir, ignore_errors=True)

    def close(self) -> None:
        for queue in self.queues.values():
            if queue.pending:
                queue.write(0)
            if queue.journal.entries or queue.changed:
                self.fold(queue)
            queue.journal.close()
