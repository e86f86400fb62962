"""The consumer groups that share a topic's queues, as ``config/sharingGroups.json``:

    {"groups": [["billing", "orders"], ["audit", "events"]]}

Only the (group, topic) pairs, not who reads what: the front keeps that in memory
(``engine/services/front/group_members.py``). After a restart it needs to know which groups may
still have members reading queues it has forgotten: those wait one session before the
front grants anything new, while a group it never had may start at once. Written whole
(temp file, fsync, ``.bak``, rename): at once when a group first has a member, before the
reply that grants it queues (so a group that was granted anything is in the file after any
crash), and, for groups that went, every ``consumer_offset_persist_interval_ms`` and at a
clean stop.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from engine.store.atomic_file import read_with_backup, write_atomically

SHARING_GROUPS_FILE = Path("config") / "sharingGroups.json"


class SharingGroups:
    def __init__(self, store_dir: Path) -> None:
        self.path = store_dir / SHARING_GROUPS_FILE
        self.pairs: set[tuple[str, str]] = read_with_backup(self.path, _parse) or set()
        self.dirty = False

    def add(self, group: str, topic: str) -> bool:
        """True if the group is new here."""
        if (group, topic) in self.pairs:
            return False
        self.pairs.add((group, topic))
        self.dirty = True
        return True

    def discard(self, group: str, topic: str) -> None:
        if (group, topic) in self.pairs:
            self.pairs.discard((group, topic))
            self.dirty = True

    def persist(self) -> None:
        if self.dirty:
            write_atomically(self.path, msgspec.json.encode({"groups": sorted(self.pairs)}))
            self.dirty = False


def _parse(data: bytes) -> set[tuple[str, str]]:
    try:
        pairs = json.loads(data)["groups"]
        return {(str(group), str(topic)) for group, topic in pairs}
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(str(exc)) from exc
