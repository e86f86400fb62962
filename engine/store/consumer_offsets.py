"""Consumer groups' committed offsets, in RocketMQ's ``config/consumerOffset.json`` shape.

    {"offsetTable": {"orders@billing": {"0": 42, "1": 17}}}

The offset stored is the next one the group will consume. A group with no
committed offset reads -1. Commits go to memory at once and to the file every
``consumer_offset_persist_interval_ms`` and at a clean stop (RocketMQ persists
every 5 s), each time whole: temp file, fsync, the old one kept as ``.bak``,
rename, directory fsync. After a crash a group therefore resumes at or before
what it committed, never after: at-least-once.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from engine.errors import ErrorCode, RequestError
from engine.names import validate_group
from engine.store.atomic_file import read_with_backup, write_atomically

OFFSETS_FILE = Path("config") / "consumerOffset.json"


class ConsumerOffsets:
    def __init__(self, store_dir: Path, *, entries_max: int = 1 << 31) -> None:
        self.path = store_dir / OFFSETS_FILE
        self.entries_max = entries_max
        self.table: dict[str, dict[str, int]] = read_with_backup(self.path, _parse) or {}
        self.keys_by_topic: dict[str, set[str]] = {}  # topic -> its "topic@group" keys: deletion is per topic
        for key in self.table:
            self.keys_by_topic.setdefault(key.partition("@")[0], set()).add(key)
        self.dirty = False

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        key = f"{topic}@{validate_group(group)}"
        queues = self.table.get(key)
        if queues is None:
            if len(self.table) >= self.entries_max:
                raise RequestError(ErrorCode.LIMIT_EXCEEDED, f"{len(self.table)} group-and-topic offset entries "
                                                             f"are stored (consumer_offset_entries_max)")
            queues = self.table[key] = {}
            self.keys_by_topic.setdefault(topic, set()).add(key)
        queues[str(queue_id)] = offset
        self.dirty = True

    def fetch(self, group: str, topic: str, queue_id: int) -> int:
        return self.table.get(f"{topic}@{validate_group(group)}", {}).get(str(queue_id), -1)

    def forget_topic(self, topic: str) -> int:
        """Topic deletion: drop every group's offsets of ``topic`` (the caller persists); how many groups."""
        gone = self.keys_by_topic.pop(topic, set())
        for key in gone:
            del self.table[key]
        if gone:
            self.dirty = True
        return len(gone)

    def persist(self) -> None:
        if self.dirty:
            data = msgspec.json.format(msgspec.json.encode({"offsetTable": self.table}, order="sorted"), indent=2)
            write_atomically(self.path, data)
            self.dirty = False


def _parse(data: bytes) -> dict[str, dict[str, int]]:
    try:
        table = json.loads(data)["offsetTable"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(str(exc)) from exc
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise ValueError("offsetTable is not a map of maps")
    return {key: {str(q): int(o) for q, o in queues.items()} for key, queues in table.items()}
