"""The front's rules over the topic table: which topics and queues a request may name, and
what creates, grows, lists and forgets topics.

The table itself (``config/topics.json``) is ``engine/store/topics.py``; this module decides
what a request may do with it:

* ``check_topic``/``check_queue``: the topic exists and is not being deleted, the queue id
  is one of its queues (TOPIC_NOT_FOUND, QUEUE_NOT_FOUND, INVALID_FIELD otherwise);
* ``check_send``/``check_deletable``: the system topics take sends only from the engine's
  own actors (the internal port), and are never deleted;
* ``auto_create``: a send to a topic that does not exist creates it (``auto_create_topic``,
  up to ``auto_create_topics_max``); ``create_topic`` creates or grows one;
* ``choose_queue``: the queue of a send that names none (by sharding key, or round robin);
* ``listing`` for ``list_topics``, and ``forget`` once a deletion is recorded.

A change is only made in memory: the front saves the table once a batch (``save``, group
commit) and holds every request that changed it, or that names a topic whose entry is not
on disk yet (``unsaved``), until the save; a save the disk refuses gives the refusal of
what waited, and is tried again.

Called by the front (``engine/actors/front.py``), for each request it routes or answers.
"""

from __future__ import annotations

import errno
import itertools
from collections.abc import Container
from pathlib import Path

from engine.config import StoreConfig
from engine.errors import ErrorCode, RequestError
from engine.ipc.protocol import CreateTopicRequest, Envelope, decode_as, encode_reply
from engine.layout import java_string_hash
from engine.names import validate_topic
from engine.store.disk_refusals import DiskRefusals
from engine.store.system_topics import SYSTEM_TOPICS
from engine.store.topics import TopicConfig, TopicTable


class TopicRules:
    """The topic table and the rules of the requests that name it. ``deleting``: the topics whose
    deletion the writer has not answered yet (``engine/services/front/topic_deletions.py``)."""

    def __init__(self, store_dir: Path, config: StoreConfig, deleting: Container[str]) -> None:
        self.table = TopicTable(store_dir)
        self.config = config
        self.deleting = deleting
        self.round_robin: dict[str, itertools.count[int]] = {}
        # A disk that refuses the table's write: what waited is refused, the save retried each tick.
        self.writes = DiskRefusals("front: the topic table", errnos=None)

    @property
    def unsaved(self) -> set[str]:
        """The topics whose entry is not on disk yet: requests naming them wait for the save."""
        return self.table.unsaved

    def save(self) -> RequestError | None:
        """Write the table (its changes of the batch); None once it is on disk, else the refusal
        for every request that waited on it: DISK_FULL, or SERVICE_NOT_AVAILABLE for another
        error of the disk. Refused, the table keeps its changes in memory for the next save."""
        try:
            self.table.save()
        except OSError as exc:
            self.writes.refused(exc)
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            return RequestError(ErrorCode.DISK_FULL if full else ErrorCode.SERVICE_NOT_AVAILABLE,
                                f"the topic table cannot be saved: {exc.strerror or exc}; retry later")
        self.writes.written()
        return None

    def get(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    def add_system_topics(self) -> None:
        """The system topics (one queue each) are in the table, on disk, before any client is served."""
        for topic in SYSTEM_TOPICS:
            if self.table.get(topic) is None:
                self.table.create(topic, 1, topic_count_max=self.config.topic_count_max, system=True)
        if self.table.unsaved:
            self.table.save()

    def check_topic(self, envelope: Envelope, *, deleting_ok: bool = False) -> str:
        if not isinstance(envelope.topic, str):
            raise RequestError(ErrorCode.INVALID_FIELD, "the field 'topic' is required and must be a string")
        if envelope.topic in self.deleting and not deleting_ok:
            raise RequestError(ErrorCode.TOPIC_NOT_FOUND, f"topic {envelope.topic!r} is being deleted")
        if self.table.get(envelope.topic) is not None:
            return envelope.topic  # an existing topic was validated when it was created
        validate_topic(envelope.topic)
        if self.table.get(envelope.topic) is None:
            raise RequestError(ErrorCode.TOPIC_NOT_FOUND, f"topic {envelope.topic!r} does not exist")
        return envelope.topic

    def check_queue(self, envelope: Envelope) -> int:
        topic = self.check_topic(envelope)
        queue_id = envelope.queue_id
        if not isinstance(queue_id, int) or isinstance(queue_id, bool):
            raise RequestError(ErrorCode.INVALID_FIELD, "the field 'queue_id' is required and must be an integer")
        config = self.table.get(topic)
        assert config is not None
        if not 0 <= queue_id < config.read_queue_nums:
            last = config.read_queue_nums - 1
            raise RequestError(ErrorCode.QUEUE_NOT_FOUND,
                               f"topic {topic!r} has queues 0..{last}; there is no queue {queue_id}")
        return queue_id

    @staticmethod
    def check_send(envelope: Envelope, *, internal: bool) -> None:
        """A system topic takes sends only from the engine's actors (``internal``: the internal port)."""
        if envelope.topic in SYSTEM_TOPICS and not internal:
            raise RequestError(ErrorCode.INVALID_TOPIC, f"the topic {envelope.topic!r} is reserved for the system")

    def check_deletable(self, envelope: Envelope) -> str:
        """The topic a ``delete_topic`` names, if it may be deleted (one being deleted may: again)."""
        topic = self.check_topic(envelope, deleting_ok=True)
        if topic in SYSTEM_TOPICS:
            raise RequestError(ErrorCode.INVALID_TOPIC, f"the topic {topic!r} is the engine's own: it cannot "
                                                        f"be deleted")
        return topic

    def auto_create(self, envelope: Envelope) -> bool:
        """A send to a topic that does not exist creates it (``auto_create_topic``); True if it did."""
        topic = envelope.topic
        if not (self.config.auto_create_topic and isinstance(topic, str) and self.table.get(topic) is None):
            return False
        if self.table.user_topic_count() >= self.config.auto_create_topics_max:
            raise RequestError(ErrorCode.LIMIT_EXCEEDED,
                               f"topic {topic!r} does not exist and the store holds {self.table.user_topic_count()} "
                               f"topics (auto_create_topics_max): create it with create_topic, or raise the limit")
        self.table.create(validate_topic(topic), self.config.topic_queue_count_default,
                          topic_count_max=self.config.topic_count_max)
        return True

    def create_topic(self, envelope: Envelope, raw: bytes) -> bytes | None:
        """Create or grow the topic in the table. None if the table changed (the request is answered
        once it is saved); else the reply, at once (the topic is there as asked)."""
        request = decode_as(CreateTopicRequest, raw)
        count = request.queue_count
        if request.topic in self.deleting:
            raise RequestError(ErrorCode.BUSY, f"topic {request.topic!r} is being deleted; retry later")
        if count is not None and count > self.config.topic_queue_count_max:
            raise RequestError(ErrorCode.INVALID_FIELD,
                               f"queue_count {count} exceeds topic_queue_count_max {self.config.topic_queue_count_max}")
        self.table.create(request.topic, count, default_queue_count=self.config.topic_queue_count_default,
                          topic_count_max=self.config.topic_count_max)
        if request.topic in self.table.unsaved:
            return None
        config = self.table.get(envelope.topic or "")
        assert config is not None
        return encode_reply(envelope.id, topic=config.topic_name, queue_count=config.write_queue_nums)

    def create_dead_letter_topic(self, topic: str) -> bool:
        """A pop group's dead-letter topic, created on its first pop; True if it was created now
        (the pop waits for the table's save)."""
        if self.table.get(topic) is not None:
            return False
        self.table.create(topic, 1, topic_count_max=self.config.topic_count_max, system=True)
        return True

    def choose_queue(self, envelope: Envelope) -> int:
        if envelope.queue_id is not None:
            return self.check_queue(envelope)
        topic = self.check_topic(envelope)
        config = self.table.get(topic)
        assert config is not None
        if isinstance(envelope.sharding_key, str):
            # Per-key order: one key always lands in one queue (while the queue count stays).
            return abs(java_string_hash(envelope.sharding_key)) % config.write_queue_nums
        counter = self.round_robin.setdefault(topic, itertools.count())
        return next(counter) % config.write_queue_nums

    def listing(self, request_id: int) -> bytes:
        """The ``list_topics`` reply: the user topics, without those being deleted."""
        topics = [{"topic": name, "queue_count": cfg.write_queue_nums}
                  for name, cfg in sorted(self.table.topics.items())
                  if name not in self.deleting and name not in SYSTEM_TOPICS]
        return encode_reply(request_id, topics=topics)

    def forget(self, topic: str) -> None:
        """The writer recorded the topic's deletion: it leaves the table (saved with the batch)."""
        self.table.delete(topic)
        self.round_robin.pop(topic, None)
