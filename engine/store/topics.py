"""The topic table: which topics exist and how many queues each has.

Persisted in RocketMQ's ``config/topics.json`` shape::

    {"topicConfigTable": {"orders": {"topicName": "orders", "readQueueNums": 4,
                                      "writeQueueNums": 4, "perm": 6}}}

Topic names are checked by ``engine.names.validate_topic`` (RocketMQ's
TopicValidator, a full match) before they enter the table.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from engine.errors import ErrorCode, RequestError
from engine.names import is_topic_name, validate_topic
from engine.store.atomic_file import read_with_backup, write_atomically
from engine.store.system_topics import SYSTEM_TOPICS

TOPICS_FILE = Path("config") / "topics.json"
PERM_READ_WRITE = 6


class TopicConfig(msgspec.Struct, rename="camel"):
    topic_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ_WRITE


class TopicTable:
    """The in-memory table; changes are saved by ``save``, one atomic write for any number of them.

    The front calls ``save`` once per batch of requests (group commit, as the log's
    flush), and answers a request that changed the table only after it: a created
    topic is on disk before anyone hears of it. ``unsaved`` names the topics whose
    entry differs from the file; requests for them wait for the save.
    """

    def __init__(self, store_dir: Path) -> None:
        self.path = store_dir / TOPICS_FILE
        self.topics: dict[str, TopicConfig] = read_with_backup(self.path, _parse) or {}
        self.unsaved: set[str] = set()

    def get(self, name: str) -> TopicConfig | None:
        return self.topics.get(name)

    def create(self, name: str, queue_count: int | None, *, default_queue_count: int = 4,
               topic_count_max: int = 1 << 31, system: bool = False) -> TopicConfig:
        """Create a topic, or grow an existing one to ``queue_count`` queues (never shrink).
        ``system``: a name the engine chose (``%DLQ%group``), where users may not create one."""
        if not system:
            validate_topic(name)
        assert is_topic_name(name), name
        existing = self.topics.get(name)
        if existing is not None and (queue_count is None or queue_count == existing.write_queue_nums):
            return existing
        count = self.user_topic_count()
        if existing is None and count >= topic_count_max and name not in SYSTEM_TOPICS:
            raise RequestError(ErrorCode.LIMIT_EXCEEDED, f"the store holds {count} topics "
                                                         f"(topic_count_max); delete some or raise the limit")
        queue_count = queue_count or default_queue_count
        if existing is not None:
            if queue_count < existing.write_queue_nums:
                raise RequestError(ErrorCode.INVALID_FIELD, "a topic's queue count can only grow")
            existing.read_queue_nums = existing.write_queue_nums = queue_count
        else:
            self.topics[name] = TopicConfig(name, queue_count, queue_count)
        self.unsaved.add(name)
        return self.topics[name]

    def user_topic_count(self) -> int:
        """Topics in the table, the engine's own (which are free of the limits) left out."""
        return len(self.topics) - sum(1 for own in SYSTEM_TOPICS if own in self.topics)

    def delete(self, name: str) -> bool:
        """Remove a topic from the table (saved by the next ``save``); False if it was not there."""
        if self.topics.pop(name, None) is None:
            return False
        self.unsaved.add(name)
        return True

    def save(self) -> None:
        """Write the whole table if anything changed (temp file, fsync, rename)."""
        if not self.unsaved:
            return
        table = {name: self.topics[name] for name in sorted(self.topics)}
        data = msgspec.json.format(msgspec.json.encode({"topicConfigTable": table}), indent=2)
        write_atomically(self.path, data)
        self.unsaved.clear()


def _parse(data: bytes) -> dict[str, TopicConfig]:
    try:
        raw = json.loads(data)
        table = msgspec.convert(raw.get("topicConfigTable", {}), dict[str, TopicConfig])
    except (json.JSONDecodeError, msgspec.ValidationError, AttributeError) as exc:
        raise ValueError(str(exc)) from exc
    return table
