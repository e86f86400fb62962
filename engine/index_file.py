"""IndexFile: a hash index from ``topic#key`` to commit log offsets.

Layout in ``layout.py``. Files live in ``index/`` and are named by their
creation time ``yyyyMMddHHmmssSSS``; the newest is the one being written.

Invariants:

* the header's ``index_count`` counts items, starting at 1 (item 0 unused);
* a slot holds the newest item number of its bucket, each item the previous
  one (``prev``); chains only point backwards (prev < item);
* items are added in commit log order, so ``end_phy_offset`` only grows and
  everything below it is indexed;
* an item is written before its slot, and the slot before the header, so a
  kill leaves at most one half-added item, at ``index_count``, which
  ``repair_after_kill`` unlinks.

Hash collisions are expected: callers must check the stored record's keys.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from engine.layout import INDEX_HEADER, INDEX_ITEM, INDEX_SLOT, index_file_bytes, index_key_hash
from engine.mapped_file import MappedFile, create_preallocated

INDEX_DIR = "index"
_INT_MAX = 0x7FFFFFFF


def index_file_name(now_ms: int) -> str:
    """``yyyyMMddHHmmssSSS`` in local time, as UtilAll#timeMillisToHumanString."""
    seconds, millis = divmod(now_ms, 1000)
    return time.strftime("%Y%m%d%H%M%S", time.localtime(seconds)) + f"{millis:03d}"


class IndexFile:
    def __init__(self, path: Path, *, hash_slot_count: int, index_count_max: int, writable: bool) -> None:
        self.path = path
        self.hash_slot_count = hash_slot_count
        self.index_count_max = index_count_max
        size = index_file_bytes(hash_slot_count=hash_slot_count, index_count=index_count_max)
        self.mapped = MappedFile(path, 0, size, writable=writable)
        self.items_base = INDEX_HEADER.size + hash_slot_count * INDEX_SLOT.size
        (self.begin_timestamp_ms, self.end_timestamp_ms, self.begin_phy_offset, self.end_phy_offset,
         self.hash_slot_used, self.index_count) = INDEX_HEADER.unpack_from(self.mapped.mm, 0)
        self.index_count = max(self.index_count, 1)

    @classmethod
    def create(cls, path: Path, *, hash_slot_count: int, index_count_max: int,
               end_phy_offset: int, end_timestamp_ms: int) -> IndexFile:
        create_preallocated(path, index_file_bytes(hash_slot_count=hash_slot_count, index_count=index_count_max))
        index = cls(path, hash_slot_count=hash_slot_count, index_count_max=index_count_max, writable=True)
        index.begin_phy_offset = index.end_phy_offset = end_phy_offset
        index.begin_timestamp_ms = index.end_timestamp_ms = end_timestamp_ms
        index._write_header()
        return index

    @property
    def is_full(self) -> bool:
        return self.index_count >= self.index_count_max

    def _write_header(self) -> None:
        INDEX_HEADER.pack_into(self.mapped.mm, 0, self.begin_timestamp_ms, self.end_timestamp_ms,
                               self.begin_phy_offset, self.end_phy_offset, self.hash_slot_used, self.index_count)

    def _slot_pos(self, key_hash: int) -> int:
        return INDEX_HEADER.size + (key_hash % self.hash_slot_count) * INDEX_SLOT.size

    def _item_pos(self, item: int) -> int:
        return self.items_base + item * INDEX_ITEM.size

    def repair_after_kill(self) -> None:
        """Unlink an item that was written (with its slot) but not yet counted."""
        item = self.index_count
        if item >= self.index_count_max:
            return
        pos = self._item_pos(item)
        key_hash, _offset, _diff, prev = INDEX_ITEM.unpack_from(self.mapped.mm, pos)
        slot_pos = self._slot_pos(key_hash)
        if INDEX_SLOT.unpack_from(self.mapped.mm, slot_pos)[0] == item:
            INDEX_SLOT.pack_into(self.mapped.mm, slot_pos, prev if 0 < prev < item else 0)
        INDEX_ITEM.pack_into(self.mapped.mm, pos, 0, 0, 0, 0)

    def put_key(self, key: str, commit_log_offset: int, store_timestamp_ms: int) -> bool:
        """Add one item (IndexFile#putKey); False when the file is full."""
        if self.is_full:
            return False
        key_hash = index_key_hash(key)
        slot_pos = self._slot_pos(key_hash)
        (slot_value,) = INDEX_SLOT.unpack_from(self.mapped.mm, slot_pos)
        if slot_value <= 0 or slot_value > self.index_count:
            slot_value = 0
        if self.begin_timestamp_ms <= 0:
            time_diff = 0
        else:
            time_diff = min(max((store_timestamp_ms - self.begin_timestamp_ms) // 1000, 0), _INT_MAX)
        item = self.index_count
        INDEX_ITEM.pack_into(self.mapped.mm, self._item_pos(item), key_hash, commit_log_offset, time_diff, slot_value)
        INDEX_SLOT.pack_into(self.mapped.mm, slot_pos, item)
        if self.index_count <= 1:
            self.begin_phy_offset = commit_log_offset
            self.begin_timestamp_ms = store_timestamp_ms
        if slot_value == 0:
            self.hash_slot_used += 1
        self.index_count += 1
        self.end_phy_offset = commit_log_offset
        self.end_timestamp_ms = store_timestamp_ms
        self._write_header()
        return True

    def time_matches(self, begin_ms: int, end_ms: int) -> bool:
        return not (end_ms < self.begin_timestamp_ms or begin_ms > self.end_timestamp_ms)

    def select(self, key: str, *, count_max: int, begin_ms: int, end_ms: int) -> list[int]:
        """Commit log offsets whose key hash matches, newest first (IndexFile#selectPhyOffset)."""
        key_hash = index_key_hash(key)
        (item,) = INDEX_SLOT.unpack_from(self.mapped.mm, self._slot_pos(key_hash))
        found: list[int] = []
        steps = 0
        while 0 < item < self.index_count and len(found) < count_max and steps < self.index_count:
            item_hash, offset, time_diff, prev = INDEX_ITEM.unpack_from(self.mapped.mm, self._item_pos(item))
            stored_ms = self.begin_timestamp_ms + time_diff * 1000
            if item_hash == key_hash and begin_ms <= stored_ms <= end_ms:
                found.append(offset)
            if prev <= 0 or prev >= item or stored_ms < begin_ms:
                break
            item = prev
            steps += 1
        return found

    def flush(self) -> None:
        self.mapped.flush()

    def close(self) -> None:
        self.mapped.close()


class IndexService:
    """The index directory: query across files, write to the newest."""

    def __init__(self, store_dir: Path, *, hash_slot_count: int, index_count_max: int, writable: bool) -> None:
        self.directory = store_dir / INDEX_DIR
        self.hash_slot_count = hash_slot_count
        self.index_count_max = index_count_max
        self.writable = writable
        self.files: list[IndexFile] = []
        self.refresh()
        if writable and self.files:
            self.files[-1].repair_after_kill()

    def refresh(self) -> None:
        names = sorted(e.name for e in os.scandir(self.directory) if e.name.isdigit()) \
            if self.directory.is_dir() else []
        opened = {f.path.name: f for f in self.files}
        for name in set(opened) - set(names):
            opened[name].close()
        self.files = [opened.get(name) or IndexFile(self.directory / name, hash_slot_count=self.hash_slot_count,
                                                    index_count_max=self.index_count_max, writable=self.writable)
                      for name in names]

    @property
    def end_phy_offset(self) -> int:
        return self.files[-1].end_phy_offset if self.files else 0

    def _writable_file(self, now_ms: int) -> IndexFile:
        if self.files and not self.files[-1].is_full:
            return self.files[-1]
        self.directory.mkdir(parents=True, exist_ok=True)
        name = index_file_name(now_ms)
        while (self.directory / name).exists() or (self.files and name <= self.files[-1].path.name):
            now_ms += 1
            name = index_file_name(now_ms)
        previous = self.files[-1] if self.files else None
        if previous is not None:
            previous.flush()
        created = IndexFile.create(self.directory / name, hash_slot_count=self.hash_slot_count,
                                   index_count_max=self.index_count_max,
                                   end_phy_offset=previous.end_phy_offset if previous else 0,
                                   end_timestamp_ms=previous.end_timestamp_ms if previous else 0)
        self.files.append(created)
        return created

    def build(self, topic: str, keys: list[str], commit_log_offset: int, store_timestamp_ms: int) -> int:
        """Index one record's keys (already including its UNIQ_KEY); returns items added.

        The caller decides what is new (by its applied offset): after a power cut
        the newest file may describe records the log lost, and their offsets are
        reused by new records, which must be indexed again.
        """
        added = 0
        for key in keys:
            index = self._writable_file(int(time.time() * 1000))
            if index.put_key(f"{topic}#{key}", commit_log_offset, store_timestamp_ms):
                added += 1
        return added

    def query(self, topic: str, key: str, *, count_max: int, begin_ms: int, end_ms: int) -> list[int]:
        """Offsets of candidate records, newest file first, without duplicates."""
        full_key = f"{topic}#{key}"
        seen: dict[int, None] = {}
        for index in reversed(self.files):
            if len(seen) >= count_max:
                break
            if not index.time_matches(begin_ms, end_ms):
                continue
            for offset in index.select(full_key, count_max=count_max, begin_ms=begin_ms, end_ms=end_ms):
                seen.setdefault(offset, None)
            if index.begin_timestamp_ms < begin_ms:
                break
        return list(seen)[:count_max]

    def flush(self) -> None:
        for index in self.files[-2:]:
            index.flush()

    def close(self) -> None:
        for index in self.files:
            index.close()
        self.files = []
