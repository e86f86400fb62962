"""The pop side of a ConsumeQueue owner: pop, ack, change of invisible time, pop stats, dead letters.

The handler glue of the owner's pops; the logic is in ``engine/services/pop/`` (its package
docstring maps the parts). The owner of a queue owns every pop group's queue index on it:
a pop reads the queue the owner already maps, and a dispatch that wakes parked pulls
wakes parked pops too, with no other hop (``docs/design.md`` 5.7 says why not another actor).

Durability follows the flush mode. Under SYNC_FLUSH a pop or ack reply is held until
its journal entries are on disk: every reply of a loop turn waits for one fdatasync of
each journal written in it (``release``, a group commit). Under ASYNC_FLUSH replies go
at once and journals are flushed with the queue files, every
``flush_consume_queue_interval_ms``.

Dead letters (``engine/services/pop/dead_letters.py``) go to the writer on the ``writer``
port; the owner records DEAD when the writer's reply says it is stored.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from engine.actors.base import Clock
from engine.actors.effects import Effects, Reply, Tell
from engine.config import StoreConfig
from engine.errors import ErrorCode, RequestError
from engine.ipc import channels
from engine.ipc.messages import PLAIN, Append, Routed
from engine.ipc.protocol import (
    AckRequest,
    ChangeInvisibleRequest,
    PopRequest,
    PopStatsRequest,
    encode_reply,
)
from engine.ipc.wire import Origin
from engine.metrics.report import Figures
from engine.names import validate_group
from engine.services.owner.owned_queues import OwnedQueues
from engine.services.owner.pull import Subscription, message_array
from engine.services.pop.dead_letters import DeadLetters
from engine.services.pop.delivery import (
    HandleTags,
    QueueRead,
    Taken,
    ack,
    change_invisible,
    current_deliveries,
    encode_handle,
    take,
)
from engine.services.pop.index_set import IndexSet
from engine.services.pop.queue_index import QueueIndex
from engine.store.pop_files import POP_DIR, Action, State, is_leftover

log = logging.getLogger(__name__)


class OwnerPops:
    def __init__(self, owned: OwnedQueues, read: QueueRead, subscription: Callable[[str], Subscription], *,
                 config: StoreConfig, clock: Clock, sync_flush: bool) -> None:
        self.owned = owned
        self.read = read
        self.subscription = subscription
        self.config = config
        self.clock = clock
        self.sync_flush = sync_flush
        self.indexes = IndexSet(owned.store_dir, journal_entries_max=config.pop_journal_entries_max)
        self.held: list[Reply] = []  # SYNC_FLUSH: replies waiting for their journal sync
        self.rotation: dict[tuple[str, str], int] = {}
        self.dead_letters = DeadLetters()
        self.tags = HandleTags()
        self.fifo_groups = frozenset(config.fifo_groups)
        self.unlocked: set[tuple[str, int]] = set()  # FIFO queues an ack unlocked: their parked pops wake

    def metrics(self) -> Figures:
        """Each pop group's queue: in flight, due, redelivered and dead-lettered messages."""
        rows: dict[str, list[list[str | int]]] = {
            "rmqpy_pop_in_flight_messages": [], "rmqpy_pop_due_messages": [], "rmqpy_pop_redelivered_messages": [],
            "rmqpy_pop_dead_lettered_messages": []}
        for (group, topic, queue_id), queue in self.indexes.queues.items():
            labels = [group, topic, str(queue_id)]
            rows["rmqpy_pop_in_flight_messages"].append([*labels, queue.in_flight])
            rows["rmqpy_pop_due_messages"].append([*labels, len(queue.due)])
            rows["rmqpy_pop_redelivered_messages"].append([*labels, queue.redeliveries])
            rows["rmqpy_pop_dead_lettered_messages"].append([*labels, queue.dead_lettered])
        return rows

    def recover(self) -> None:
        """Open the ack state of every pop group on the queues this owner holds."""
        root = self.owned.store_dir / POP_DIR
        deletions = self.owned.deleted_topics.deletion_offsets
        for queue_dir in sorted(root.glob("*/*/*")):
            group, topic, queue = queue_dir.parts[-3:]
            if not (queue.isascii() and queue.isdigit()) or not self.owned.is_mine(topic, int(queue)):
                continue
            if is_leftover(queue_dir, deletions):  # its topic was deleted while we were down
                log.info("pop state %s/%s/%s removed: its topic was deleted", group, topic, queue)
                shutil.rmtree(queue_dir, ignore_errors=True)
                continue
            cq = self.owned.get(topic, int(queue))  # None: the queue holds no message (a power cut took them)
            self.indexes.open(group, topic, int(queue), queue_end=cq.max_offset if cq else 0)
        log.info("pop state of %d (group, topic, queue) loaded", len(self.indexes.queues))

    def queue(self, group: str, topic: str, queue_id: int) -> QueueIndex:
        cq = self.owned.get(topic, queue_id)
        return self.indexes.open(group, topic, queue_id, queue_end=cq.max_offset if cq else None,
                                 incarnation=self.owned.deleted_topics.deletion_offsets.get(topic, -1))

    # -- requests -------------------------------------------------------------------------------

    def pop(self, request: PopRequest, queue_ids: list[int]) -> tuple[bytes, bool]:
        """The reply to a pop, and whether it found nothing (a long poll may park it)."""
        validate_group(request.group)
        invisible_ms = min(request.invisible_ms, self.config.pop_invisible_ms_max)
        until_ms = self.clock.wall_ms() + invisible_ms
        max_messages = min(request.max_messages, self.config.pull_message_count_max)
        subscription = self.subscription(request.subscription)
        taken = Taken()
        fifo = request.group in self.fifo_groups
        if not all(self.owned.is_mine(request.topic, queue_id) for queue_id in queue_ids):
            raise RequestError(ErrorCode.SERVICE_NOT_AVAILABLE, "the queue moved to another owner; retry")
        start = self.rotation.get((request.group, request.topic), 0)
        self.rotation[(request.group, request.topic)] = start + 1
        for i in range(len(queue_ids)):
            queue_id = queue_ids[(start + i) % len(queue_ids)]
            queue = self.queue(request.group, request.topic, queue_id)
            scheduled = take(queue, self.owned.get(request.topic, queue_id), self.read, taken,
                             max_messages=max_messages, max_bytes=self.config.pull_bytes_max,
                             subscription=subscription, until_ms=until_ms, tag=self.tags.of(queue), fifo=fifo)
            for offsets, generation in scheduled:
                self.indexes.schedule(queue, until_ms, offsets, generation)
            self.indexes.write(queue, self.clock.mono_ms())
            if taken.count >= max_messages:
                break
        reply = encode_reply(request.id, messages=message_array(taken.encoded, taken.count),
                             receipt_handles=taken.receipt_handles, attempts=taken.attempts, invisible_ms=invisible_ms)
        return reply, not taken.count

    def ack(self, request: AckRequest, out: Effects) -> bytes:
        validate_group(request.group)
        queue = self.queue(request.group, request.topic, request.queue_id)
        tag = self.tags.of(queue)
        if request.dead_letter:  # the consumer gave up on them: to the DLQ now, whatever the attempt
            current, outcome = current_deliveries(queue, request.receipt_handles, tag)
            for offset, generation in current:
                if offset not in queue.dead_lettering:
                    queue.due.pop(offset, None)
                    self.send_dead_letter(queue, offset, generation, out)
            return encode_reply(request.id, acked=outcome.acked, failed=outcome.failed)
        outcome = ack(queue, request.receipt_handles, tag)
        self.indexes.write(queue, self.clock.mono_ms())
        if request.group in self.fifo_groups and outcome.acked and not queue.invisible:
            self.unlocked.add((request.topic, request.queue_id))
        return encode_reply(request.id, acked=outcome.acked, failed=outcome.failed)

    def change_invisible(self, request: ChangeInvisibleRequest) -> bytes:
        validate_group(request.group)
        invisible_ms = min(request.invisible_ms, self.config.pop_invisible_ms_max)
        until_ms = self.clock.wall_ms() + invisible_ms
        queue = self.queue(request.group, request.topic, request.queue_id)
        tag = self.tags.of(queue)
        changed = change_invisible(queue, request.receipt_handle, tag, until_ms=until_ms)
        if isinstance(changed, str):
            raise RequestError(ErrorCode.INVALID_RECEIPT_HANDLE, changed)
        offset, generation = changed
        self.indexes.schedule(queue, until_ms, [offset], generation)
        self.indexes.write(queue, self.clock.mono_ms())
        return encode_reply(request.id, receipt_handle=encode_handle(request.queue_id, offset, generation, tag),
                            invisible_ms=invisible_ms)

    def stats(self, request: PopStatsRequest) -> bytes:
        validate_group(request.group)
        queue = self.indexes.get(request.group, request.topic, request.queue_id)
        cq = self.owned.get(request.topic, request.queue_id)
        if queue is None:
            return encode_reply(request.id, ack_floor=0, pop_cursor=-1, in_flight=0, due=0, redelivered=0,
                                dead_lettered=0, journal_entries=0, segments=0,
                                max_offset=cq.max_offset if cq else 0)
        return encode_reply(request.id, ack_floor=queue.ack_floor(), pop_cursor=queue.cursor,
                            in_flight=queue.in_flight, due=len(queue.due), redelivered=queue.redelivered(),
                            dead_lettered=queue.dead_lettered, journal_entries=queue.journal.entries,
                            segments=len(queue.segments), max_offset=cq.max_offset if cq else 0)

    # -- replies and durability -----------------------------------------------------------------

    def reply(self, out: Effects, origin: Origin, reply: bytes) -> None:
        """Send now (ASYNC_FLUSH), or once this turn's journal entries are on disk (SYNC_FLUSH)."""
        if self.sync_flush and self.indexes.written:
            self.held.append(Reply(origin, reply))
        else:
            out.reply(origin, reply)

    def release(self, out: Effects) -> None:
        """SYNC_FLUSH's group commit: one fdatasync a journal, then every held reply."""
        if self.held or self.indexes.written:
            if self.sync_flush:
                self.indexes.sync()
            out.extend(self.held)
            self.held.clear()

    def journals_to_flush(self) -> list[Path]:
        """ASYNC_FLUSH: the journals written since the last flush, for the owner's flush thread
        (under SYNC_FLUSH every turn's journals are synced before its replies go: nothing here)."""
        return [] if self.sync_flush else self.indexes.journal_paths()

    # -- time -----------------------------------------------------------------------------------

    def tick(self, out: Effects) -> set[tuple[str, int]]:
        """Deliveries whose invisible time passed become due (or go to the DLQ); idle journals are
        folded. Returns the queues with new due deliveries (their parked pops are woken)."""
        now_ms = self.clock.wall_ms()
        woken: set[tuple[str, int]] = set()
        for queue in self.indexes.expire(now_ms):
            for offset in list(queue.due):
                _state, attempt, generation, _until = queue.entry(offset)
                if attempt >= self.config.max_delivery_attempts:
                    del queue.due[offset]
                    self.send_dead_letter(queue, offset, generation, out)
            if queue.due:
                woken.add((queue.key[1], queue.key[2]))
        self.retry_dead_letters(out)
        mono = self.clock.mono_ms()
        self.indexes.fold_idle(mono, self.config.pop_journal_idle_fold_ms)
        return woken

    def send_dead_letter(self, queue: QueueIndex, offset: int, generation: int, out: Effects) -> None:
        _group, topic, queue_id = queue.key
        cq = self.owned.get(topic, queue_id)
        result = self.read(cq, offset, 1, self.config.pull_bytes_max, Subscription("*"))
        if not result.message_count:
            queue.record(offset, Action.SKIP)  # gone (retention) or damaged: nothing to move
            self.indexes.write(queue, self.clock.mono_ms())
            return
        client, request = self.dead_letters.letter(queue, offset, generation, result.encoded[0],
                                                   self.clock.mono_ms() + self.config.dead_letter_retry_ms)
        out.append(Tell(channels.WRITER, Routed(client, PLAIN, Append(0, self.clock.mono_ms(), True)), request,
                        lambda: None))  # refused: sent again when its deadline passes

    def retry_dead_letters(self, out: Effects) -> None:
        for letter in self.dead_letters.overdue(self.clock.mono_ms()):
            if self.indexes.queues.get(letter.queue.key) is letter.queue:
                self.send_dead_letter(letter.queue, letter.offset, letter.generation, out)

    def on_writer_reply(self, client: bytes, reply_frame: bytes) -> None:
        """The writer's answer to the dead-letter send of ``client``."""
        answered = self.dead_letters.answered(client, reply_frame)
        if answered is None:
            return  # answered after its retry went out
        letter, reply = answered
        queue = letter.queue
        if reply is None or not reply.ok or self.indexes.queues.get(queue.key) is not queue:
            log.warning("dead-letter send for %s/%s/%d offset %d refused: %s; retried", *queue.key,
                        letter.offset, reply.error if reply is not None else "no readable reply")
            self.indexes.schedule(queue, self.clock.wall_ms() + self.config.dead_letter_retry_ms, [letter.offset],
                                  letter.generation)
            return
        state, _attempt, generation, _until = queue.entry(letter.offset)
        if state == State.DELIVERED and generation == letter.generation:  # not acked meanwhile
            queue.record(letter.offset, Action.DEAD)
            self.indexes.write(queue, self.clock.mono_ms())
            if queue.key[0] in self.fifo_groups and not queue.invisible:
                self.unlocked.add((queue.key[1], queue.key[2]))

    def close(self) -> None:
        self.indexes.close()
