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

from engine.atomic_file import read_with_backup, write_atomically
from engine.errors import ErrorCode, RequestError
from engine.names import validate_topic

TOPICS_FILE = Path("config") / "topics.json"
PERM_READ_WRITE = 6


class TopicConfig(msgspec.Struct, rename="camel"):
    topic_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ_WRITE


class TopicTable:
    """The in-memory table, saved atomically on every change."""

    def __init__(self, store_dir: Path) -> None:
        self.path = store_dir / TOPICS_FILE
        self.topics: dict[str, TopicConfig] = read_with_backup(self.path, _parse) or {}

    def get(self, name: str) -> TopicConfig | None:
        return self.topics.get(name)

    def create(self, name: str, queue_count: int | None, *, default_queue_count: int = 4) -> TopicConfig:
        """Create a topic, or grow an existing one to ``queue_count`` queues (never shrink)."""
        validate_topic(name)
        existing = self.topics.get(name)
        if existing is not None and queue_count is None:
            return existing
        queue_count = queue_count or default_queue_count
        if existing is not None:
            if queue_count < existing.write_queue_nums:
                raise RequestError(ErrorCode.INVALID_FIELD, "a topic's queue count can only grow")
            existing.read_queue_nums = existing.write_queue_nums = queue_count
        else:
            self.topics[name] = TopicConfig(name, queue_count, queue_count)
        self._save()
        return self.topics[name]

    def delete(self, name: str) -> bool:
        """Remove a topic from the table (saved at once); False if it was not there."""
        if self.topics.pop(name, None) is None:
            return False
        self._save()
        return True

    def _save(self) -> None:
        table = {name: msgspec.to_builtins(cfg) for name, cfg in sorted(self.topics.items())}
        write_atomically(self.path, json.dumps({"topicConfigTable": table}, indent=2).encode())


def _parse(data: bytes) -> dict[str, TopicConfig]:
    try:
        raw = json.loads(data)
        table = msgspec.convert(raw.get("topicConfigTable", {}), dict[str, TopicConfig])
    except (json.JSONDecodeError, msgspec.ValidationError, AttributeError) as exc:
        raise ValueError(str(exc)) from exc
    return table
