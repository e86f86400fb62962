"""Deleted topics: which records of the CommitLog belong to no queue any more.

Deleting a topic removes its queues, its consumer offsets and its entry in
``config/topics.json``, but the CommitLog keeps the records' bytes until
retention deletes their segments. This table says, for each deleted topic,
the log's written offset at the moment of deletion (its *deletion offset*):

* every record of that topic **below** the deletion offset is hidden: no
  queue unit is made for it (dispatch, catch-up, recovery, repair), no key
  lookup returns it, and recovery does not count it into a queue counter;
* records **at or past** it belong to a topic of the same name created
  later, whose queues start again at offset 0.

Invariants: a deletion offset only grows for a topic (a topic deleted twice
keeps the later offset); an entry is forgotten once the log's min offset
has passed it, since nothing it hides is left.

Written only by the CommitLog writer (the single appender decides where the
deletion falls in the log), atomically, once for a batch of deletions and
before it answers any of them::

    {"deletedTopicTable": {"orders": 1048576}}

Other actors reload it when the ``TOPIC_DELETIONS`` slot of the shared
offsets changes; the writer bumps that slot after each write.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from engine.store.atomic_file import read_with_backup, write_atomically

if TYPE_CHECKING:
    from engine.store.consume_queue import ConsumeQueue

DELETED_TOPICS_FILE = Path("config") / "deletedTopics.json"


class DeletedTopics:
    def __init__(self, store_dir: Path) -> None:
        self.path = store_dir / DELETED_TOPICS_FILE
        self.deletion_offsets: dict[str, int] = read_with_backup(self.path, _parse) or {}
        self.generation = -1

    def follow(self, generation: int) -> dict[str, int]:
        """Reload when the writer's ``TOPIC_DELETIONS`` count moved; the entries that are new."""
        if generation == self.generation:
            return {}
        self.generation = generation
        return self.reload()

    def reload(self) -> dict[str, int]:
        """Read the file again; return the entries that are new or moved forward."""
        fresh = read_with_backup(self.path, _parse) or {}
        changed = {topic: offset for topic, offset in fresh.items() if self.deletion_offsets.get(topic) != offset}
        self.deletion_offsets = fresh
        return changed

    def hides(self, topic: str, commit_log_offset: int) -> bool:
        """True for a record of a deleted topic that was written before the deletion."""
        deletion_offset = self.deletion_offsets.get(topic)
        return deletion_offset is not None and commit_log_offset < deletion_offset

    def is_leftover(self, cq: ConsumeQueue) -> bool:
        """True for a queue left from before its topic's deletion (its owner had not removed it).

        Units are written in log order and a deleted topic's queues are removed before any
        unit at or past the deletion offset is applied, so the first unit tells."""
        if cq.topic not in self.deletion_offsets:
            return False
        first = cq.get(cq.min_offset) if cq.max_offset > cq.min_offset else None
        return first is None or first.is_blank or self.hides(cq.topic, first.commit_log_offset)

    def __bool__(self) -> bool:
        return bool(self.deletion_offsets)

    def record(self, topic: str, deletion_offset: int) -> None:
        """The writer's part: ``topic`` was deleted when the log ended at ``deletion_offset``.

        In memory only: the writer saves once for a batch of deletions (``save``) and
        answers none of them before."""
        assert deletion_offset >= self.deletion_offsets.get(topic, 0), "a deletion offset never moves back"
        self.deletion_offsets[topic] = deletion_offset

    def undo(self, topic: str, previous_offset: int | None) -> None:
        """Take back a ``record`` that could not be saved."""
        if previous_offset is None:
            self.deletion_offsets.pop(topic, None)
        else:
            self.deletion_offsets[topic] = previous_offset

    def save(self) -> None:
        self._save()

    def clamp_to(self, log_end: int) -> list[str]:
        """Recovery's part: a deletion offset past the recovered end of the log (a power cut took
        the log's tail after the deletion was saved) comes down to that end; otherwise it would
        hide the records a topic of the same name gets at those offsets again. The topics moved."""
        moved = [topic for topic, offset in self.deletion_offsets.items() if offset > log_end]
        for topic in moved:
            self.deletion_offsets[topic] = log_end
        return moved

    def forget_below(self, log_min_offset: int) -> int:
        """Retention: drop the entries that hide nothing left in the log; how many went."""
        gone = [topic for topic, offset in self.deletion_offsets.items() if offset <= log_min_offset]
        for topic in gone:
            del self.deletion_offsets[topic]
        if gone:
            self._save()
        return len(gone)

    @property
    def crc(self) -> int:
        """A replica's check that it holds the table its master sent the log bytes with."""
        return table_crc(self.deletion_offsets)

    def adopt(self, data: bytes) -> list[str]:
        """A replica's part: its master's table (the file's bytes) replaces this one, saved; the
        topics whose deletion is new or moved. ValueError if the bytes are not a table."""
        fresh = _parse(data)
        changed = [topic for topic, offset in fresh.items() if self.deletion_offsets.get(topic) != offset]
        self.deletion_offsets = fresh
        self._save()
        return changed

    def _save(self) -> None:
        table = dict(sorted(self.deletion_offsets.items()))
        write_atomically(self.path, json.dumps({"deletedTopicTable": table}, indent=2).encode())


def table_crc(deletion_offsets: dict[str, int]) -> int:
    """CRC-32 of the table's entries in name order (not of the file: the same table, however written)."""
    return zlib.crc32(json.dumps(sorted(deletion_offsets.items())).encode())


def parse_table(data: bytes) -> dict[str, int]:
    return _parse(data)


def _parse(data: bytes) -> dict[str, int]:
    try:
        raw = json.loads(data)
        return msgspec.convert(raw.get("deletedTopicTable", {}), dict[str, int])
    except (json.JSONDecodeError, msgspec.ValidationError, AttributeError) as exc:
        raise ValueError(str(exc)) from exc
