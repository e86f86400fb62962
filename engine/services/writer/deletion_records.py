"""The writer's records of topic deletions: where each falls in the log, group-committed.

A ``delete_topic`` the front forwards takes the writer's written offset as the topic's
deletion offset (``record``): every send handled before it lies below, every later one at
or past it, since the writer takes its requests in order. The table
(``config/deletedTopics.json``, ``engine/store/deleted_topics.py``) is written once for all
the deletions of a batch (``save``), and before a send that came after one (a deletion's
queues start again at 0); only then is each answered, with a ``TopicDeletion`` for the
front, which drops the topic from its table on ``recorded=True``. A write that fails takes
the entries back and answers SERVICE_NOT_AVAILABLE with ``recorded=False``. Owners and the
index builder reread the table when the ``TOPIC_DELETIONS`` slot moves (``announce``).

Called by the writer (``engine/actors/commit_log_writer.py``): ``record`` for each
``DeleteTopic``, ``save`` after a batch and before a later send, ``clamp_to`` at recovery
and ``forget_below`` after retention deleted segments.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ErrorCode
from engine.ipc.messages import TopicDeletion
from engine.ipc.protocol import encode_error, encode_reply
from engine.ipc.wire import Origin
from engine.store.deleted_topics import DeletedTopics
from engine.store.shared_offsets import TOPIC_DELETIONS, SharedOffsets

log = logging.getLogger(__name__)


@dataclass
class UnsavedDeletion:
    """A topic deletion recorded in memory, answered once the deletion table is on disk."""

    reply_to: Origin
    request_id: int
    topic: str
    deletion_offset: int
    previous_offset: int | None  # the topic's entry before, restored if the save fails


class DeletionRecords:
    """The deletion table, the deletions of this batch not on disk yet, and their announcement."""

    def __init__(self, store_dir: Path, slots: SharedOffsets) -> None:
        self.table = DeletedTopics(store_dir)
        self.slots = slots
        self.unsaved: list[UnsavedDeletion] = []  # recorded in memory, answered after the save

    def record(self, reply_to: Origin, request_id: int, topic: str, deletion_offset: int) -> None:
        """Hide the topic's records below ``deletion_offset``; answered by ``save``."""
        self.unsaved.append(UnsavedDeletion(reply_to, request_id, topic, deletion_offset,
                                            self.table.deletion_offsets.get(topic)))
        self.table.record(topic, deletion_offset)

    def save(self, forget_queues: Callable[[str], int]) -> list[tuple[Origin, bytes, TopicDeletion]]:
        """Group commit of the deletion table: one write for the batch, then every answer (whom to
        answer, the reply, the front's note). ``forget_queues``: drops a deleted topic's queue
        counters once its deletion is on disk; how many queues it had."""
        batch, self.unsaved = self.unsaved, []
        try:
            self.table.save()
        except OSError as exc:
            log.error("cannot record the deletion of %d topics: %s", len(batch), exc)
            for deletion in reversed(batch):  # back to what the file holds
                self.table.undo(deletion.topic, deletion.previous_offset)
            return [(deletion.reply_to, encode_error(deletion.request_id, ErrorCode.SERVICE_NOT_AVAILABLE,
                                                     f"cannot record the deletion: {exc}"),
                     TopicDeletion(deletion.topic, recorded=False)) for deletion in batch]
        for deletion in batch:
            queues = forget_queues(deletion.topic)
            log.info("topic %r deleted at log offset %d (%d queues)", deletion.topic, deletion.deletion_offset,
                     queues)
        self.announce()
        return [(deletion.reply_to,
                 encode_reply(deletion.request_id, topic=deletion.topic, deletion_offset=deletion.deletion_offset),
                 TopicDeletion(deletion.topic, recorded=True)) for deletion in batch]

    def adopt(self, data: bytes, forget_queues: Callable[[str], int]) -> None:
        """A replica's part: its master's table replaces this one (``ConfigSnapshot``, sent before
        any record past a new deletion), and a newly deleted topic's queues start again at 0."""
        changed = self.table.adopt(data)
        for topic in changed:
            forget_queues(topic)
        if changed:
            log.info("the master deleted %s", ", ".join(sorted(changed)))
        self.announce()

    def clamp_to(self, log_end: int) -> None:
        """Recovery: a log that ends before a deletion's offset takes that offset down with it,
        saved before the owners and the index builder read it."""
        moved = self.table.clamp_to(log_end)
        if moved:
            log.warning("the log ends at %d, before the deletion of %s: their deletion offsets follow it down",
                        log_end, ", ".join(sorted(moved)))
            self.table.save()
            self.announce()

    def forget_below(self, log_min_offset: int) -> None:
        """Retention deleted the segments below ``log_min_offset``: entries that hide nothing more go."""
        try:
            if self.table.forget_below(log_min_offset):
                self.announce()
        except OSError as exc:  # harmless: the entries hide records that are gone; retried next time
            log.error("cannot rewrite the deleted-topic table: %s", exc)

    def announce(self) -> None:
        """Owners and the index builder reread ``config/deletedTopics.json`` when this count moves."""
        self.slots.set(TOPIC_DELETIONS, self.slots.get(TOPIC_DELETIONS) + 1)
