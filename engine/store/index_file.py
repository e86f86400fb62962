"""IndexFile: a hash index from ``topic#key`` to commit log offsets.

Layout in ``engine/layout.py``. Files live in ``index/`` and are named by their
creation time ``yyyyMMddHHmmssSSS``; the newest is the one being written.

Invariants:

* the header's ``index_count`` counts items, starting at 1 (item 0 unused);
* a slot holds the newest item number of its bucket, each item the previous
  one (``prev``); chains only point backwards (prev < item);
* items are added in commit log order, so ``end_phy_offset`` only grows and
  everything below it is indexed;
* an item is written before its slot, and the slot before the header, so a
  kill leaves at most one half-added item, at ``index_count``, which
  ``repair_after_kill`` unlinks;
* an item is added when the header's count covers it: readers answer only
  items below the count they loaded (engine/services/front/key_lookup.py).

Hash collisions are expected: callers must check the stored record's keys.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.codec import index_header, index_key_hash, index_put_keys, index_put_records, index_select, unpack_entry
from engine.layout import INDEX_HEADER, INDEX_ITEM, INDEX_SLOT, index_file_bytes
from engine.names import is_decimal
from engine.store.mapped_file import PAGE_BYTES, MappedFile, create_preallocated, fsync_dir

INDEX_DIR = "index"
PUT_RESERVE_ITEMS = 4096  # items one put_records call may add: their blocks are reserved before it


def index_file_name(now_ms: int) -> str:
    """``yyyyMMddHHmmssSSS`` in local time, as UtilAll#timeMillisToHumanString."""
    seconds, millis = divmod(now_ms, 1000)
    return time.strftime("%Y%m%d%H%M%S", time.localtime(seconds)) + f"{millis:03d}"


def index_file_ms(name: str) -> int:
    """The time ``index_file_name`` made ``name`` of (an hour off at most, in the hour a change
    of daylight saving time repeats)."""
    return int(time.mktime(time.strptime(name[:14], "%Y%m%d%H%M%S"))) * 1000 + int(name[14:17])


class IndexStalled(Exception):
    """The index could not take a record (a full disk: the OSError is the cause); the records
    before ``commit_log_offset`` are in."""

    def __init__(self, commit_log_offset: int) -> None:
        super().__init__(f"the index stopped at the record at {commit_log_offset}")
        self.commit_log_offset = commit_log_offset


def _item_at(entries: Sequence[Any] | bytes, at: int) -> tuple[Any, int]:
    """The record at cursor ``at`` of ``entries`` and the cursor after it: an index in a list, a
    byte position in packed entries (``codec_py.PACKED_ENTRY``, unpacked here as a tuple)."""
    return unpack_entry(entries, at) if isinstance(entries, bytes) else (entries[at], at + 1)


def _offset_of(entry: Any) -> int:
    return int(entry[3] if isinstance(entry, tuple) else entry.commit_log_offset)


class IndexFile:
    def __init__(self, path: Path, *, hash_slot_count: int, index_count_max: int, writable: bool,
                 reserve_step_bytes: int | None = None) -> None:
        """``reserve_step_bytes``: the file is sparse past its header and slots, and its items'
        blocks are reserved up to this far ahead of them (None: the file is fully allocated)."""
        self.path = path
        self.hash_slot_count = hash_slot_count
        self.index_count_max = index_count_max
        size = index_file_bytes(hash_slot_count=hash_slot_count, index_count=index_count_max)
        self.mapped = MappedFile(path, 0, size, writable=writable, reserve_step_bytes=reserve_step_bytes)
        self.items_base = INDEX_HEADER.size + hash_slot_count * INDEX_SLOT.size
        self.reload_header()

    @classmethod
    def create(cls, path: Path, *, hash_slot_count: int, index_count_max: int,
               end_phy_offset: int, end_timestamp_ms: int, reserve_step_bytes: int | None = None) -> IndexFile:
        """A new file: its header and slots (random writes) get real blocks now; its items
        (appended in order) only as ``put_keys`` reserves them, if ``reserve_step_bytes``."""
        slots_end = INDEX_HEADER.size + hash_slot_count * INDEX_SLOT.size
        create_preallocated(path, index_file_bytes(hash_slot_count=hash_slot_count, index_count=index_count_max),
                            reserve_bytes=None if reserve_step_bytes is None else slots_end + PAGE_BYTES)
        index = cls(path, hash_slot_count=hash_slot_count, index_count_max=index_count_max, writable=True,
                    reserve_step_bytes=reserve_step_bytes)
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
        self.mapped.zero(pos, pos + INDEX_ITEM.size)  # never writes a page that may be a hole

    def put_key(self, key: str, commit_log_offset: int, store_timestamp_ms: int) -> bool:
        """Add one item (IndexFile#putKey); False when the file is full."""
        return self.put_keys("", [key], commit_log_offset, store_timestamp_ms) == 1

    def put_keys(self, prefix: str, keys: list[str], commit_log_offset: int, store_timestamp_ms: int) -> int:
        """Add an item for ``prefix + key`` of every key (``codec.index_put_keys``); how many
        were added: fewer than ``len(keys)`` when the file filled up."""
        # Blocks for the items this call may add (slots and header lie before them): ENOSPC here.
        self.mapped.reserve(min(self.mapped.size_bytes, self._item_pos(self.index_count + len(keys) + 1)))
        added = index_put_keys(self.mapped.mm, self.hash_slot_count, self.index_count_max, prefix, keys,
                               commit_log_offset, store_timestamp_ms)
        if added:
            self.reload_header()  # the header in the mapping is the state
        return added

    def put_records(self, entries: Sequence[Any] | bytes, entry: int, key: int, min_offset: int) -> tuple[int, int]:
        """``put_keys`` for the records of ``entries`` (``DispatchEntry``s or their fields as tuples,
        or packed entries: ``entry`` is then a byte position)
        from ``entries[entry]``'s ``keys[key:]`` on, records below ``min_offset`` skipped, up to
        ``PUT_RESERVE_ITEMS`` items a call (``codec.index_put_records``): where it stopped,
        ``(len(entries), 0)`` once every record is in; the file is full if it stopped short of that
        with ``is_full``."""
        limit = min(self.index_count_max, self.index_count + PUT_RESERVE_ITEMS)
        self.mapped.reserve(min(self.mapped.size_bytes, self._item_pos(limit)))  # ENOSPC here, not SIGBUS
        reached = index_put_records(self.mapped.mm, self.hash_slot_count, limit, entries, entry, key, min_offset)
        self.reload_header()  # the header in the mapping is the state
        return reached

    def reload_header(self) -> int:
        """Read the header into the attributes (at open, after puts, and in a reader following
        the builder); the item count, at least 1 (item 0 is never used)."""
        (self.begin_timestamp_ms, self.end_timestamp_ms, self.begin_phy_offset, self.end_phy_offset,
         self.hash_slot_used, self.index_count) = index_header(self.mapped.mm)
        self.index_count = max(self.index_count, 1)
        return self.index_count

    def time_matches(self, begin_ms: int, end_ms: int) -> bool:
        return not (end_ms < self.begin_timestamp_ms or begin_ms > self.end_timestamp_ms)

    def select(self, key: str, *, count_max: int, begin_ms: int, end_ms: int) -> list[int]:
        """Commit log offsets whose key hash matches, newest first (IndexFile#selectPhyOffset),
        among the items the last ``reload_header`` counted."""
        # That reload loaded the count with acquire; the walk answers only items below it, so
        # every item answered is complete while the index builder appends in another process
        # (engine/services/front/key_lookup.py).
        return index_select(self.mapped.mm, self.hash_slot_count, self.index_count_max, self.index_count,
                            index_key_hash(key), self.begin_timestamp_ms, count_max, begin_ms, end_ms)

    def flush(self) -> None:
        self.mapped.flush()

    def close(self) -> None:
        self.mapped.close()


class IndexService:
    """The index directory: query across files, write to the newest.

    Only the newest file and a few recently queried ones are mapped
    (``mapped_files_max``); the others are known by their headers alone.
    """

    def __init__(self, store_dir: Path, *, hash_slot_count: int, index_count_max: int, writable: bool,
                 mapped_files_max: int = 4, reserve_step_bytes: int | None = None) -> None:
        self.directory = store_dir / INDEX_DIR
        self.reserve_step_bytes = reserve_step_bytes
        self.hash_slot_count = hash_slot_count
        self.index_count_max = index_count_max
        self.writable = writable
        self.mapped_files_max = mapped_files_max
        self.names: list[str] = []
        self.headers: dict[str, tuple[int, int, int, int]] = {}  # begin ts, end ts, begin phy, end phy
        self.mapped: dict[str, IndexFile] = {}  # least recently used first
        self.dirty: set[str] = set()  # files written since the last flush_dirty
        self._writing: IndexFile | None = None  # the newest file, while it takes items
        self.refresh()
        if writable and self.names:
            self.newest().repair_after_kill()

    def refresh(self) -> None:
        """List ``index/`` again, and read again the headers of the files kept mapped."""
        self._writing = None
        names = sorted(e.name for e in os.scandir(self.directory) if is_decimal(e.name)) \
            if self.directory.is_dir() else []
        for name in set(self.mapped) - set(names):
            self.mapped.pop(name).close()
        self.names = names
        for name in names:
            if name not in self.headers or name in names[-2:]:  # the newest two may still have grown
                with open(self.directory / name, "rb") as f:
                    header = INDEX_HEADER.unpack(f.read(INDEX_HEADER.size))
                begin_ts, end_ts, begin_phy, end_phy, _slots, _count = header
                self.headers[name] = (begin_ts, end_ts, begin_phy, end_phy)
        for index in self.mapped.values():  # a reader answers only what a header counts
            index.reload_header()

    def open(self, name: str) -> IndexFile:
        index = self.mapped.pop(name, None)
        if index is None:
            index = IndexFile(self.directory / name, hash_slot_count=self.hash_slot_count,
                              index_count_max=self.index_count_max, writable=self.writable,
                              reserve_step_bytes=self.reserve_step_bytes)
        self.mapped[name] = index
        for old in list(self.mapped)[: max(0, len(self.mapped) - self.mapped_files_max)]:
            if old != self.names[-1]:
                self.mapped.pop(old).close()
        return index

    def newest(self) -> IndexFile:
        return self.open(self.names[-1])

    @property
    def file_count(self) -> int:
        return len(self.names)

    @property
    def end_phy_offset(self) -> int:
        return self.newest().end_phy_offset if self.names else 0

    def _writable_file(self, now_ms: int) -> IndexFile:
        if self.names and not self.newest().is_full:
            return self.newest()
        self.directory.mkdir(parents=True, exist_ok=True)
        name = index_file_name(now_ms)
        if self.names and name <= self.names[-1]:
            # The record's store time is before the newest file's name: a wall clock set back
            # on the engine that stamped them. Files are ordered by name: the next is named after.
            now_ms = max(now_ms, index_file_ms(self.names[-1]) + 1)
            name = index_file_name(now_ms)
            while name <= self.names[-1]:  # the hour a change of daylight saving time repeats
                now_ms += 60_000
                name = index_file_name(now_ms)
        while (self.directory / name).exists():
            now_ms += 1
            name = index_file_name(now_ms)
        previous = self.newest() if self.names else None
        if previous is not None:
            previous.flush()
            self.headers[self.names[-1]] = (previous.begin_timestamp_ms, previous.end_timestamp_ms,
                                            previous.begin_phy_offset, previous.end_phy_offset)
        created = IndexFile.create(self.directory / name, hash_slot_count=self.hash_slot_count,
                                   index_count_max=self.index_count_max,
                                   end_phy_offset=previous.end_phy_offset if previous else 0,
                                   end_timestamp_ms=previous.end_timestamp_ms if previous else 0,
                                   reserve_step_bytes=self.reserve_step_bytes)
        if previous is not None:
            self.dirty.add(self.names[-1])
        self.names.append(name)
        self.headers[name] = (0, 0, 0, 0)
        self.mapped[name] = created
        return created

    def build(self, topic: str, keys: list[str], commit_log_offset: int, store_timestamp_ms: int) -> int:
        """Index one record's keys (already including its UNIQ_KEY); returns items added."""
        return self.build_records([(topic, 0, 0, commit_log_offset, 0, 0, store_timestamp_ms, keys)])

    def build_records(self, entries: Sequence[Any] | bytes, min_offset: int = 0) -> int:
        """Index the keys of every record of ``entries`` at or past ``min_offset`` (``DispatchEntry``s,
        their fields as tuples, or packed entries as a dispatch batch brings them; in log order;
        keys already including the UNIQ_KEY), in the C
        codec a file at a time; returns items added. ``IndexStalled`` (a full disk) names the
        record to retry from: the records before it are in.

        The caller decides what is new (by its applied offset): after a power cut
        the newest file may describe records the log lost, and their offsets are
        reused by new records, which must be indexed again.
        """
        entry = key = added = 0
        while entry < len(entries) and _offset_of((found := _item_at(entries, entry))[0]) < min_offset:
            entry = found[1]  # in log order: only a first run is older
        while entry < len(entries):
            index, fresh = self._writing, False
            try:
                if index is None or index.is_full:
                    # named by the record's store time, not by the clock: close to the moment of
                    # creation (RocketMQ's name), and the same on every replay of a simulated run
                    item = _item_at(entries, entry)[0]
                    index = self._writing = self._writable_file(item[6] if isinstance(item, tuple)
                                                                else item.store_timestamp)
                    fresh = True
                before = index.index_count
                entry, key = index.put_records(entries, entry, key, min_offset)
            except OSError as exc:
                raise IndexStalled(_offset_of(_item_at(entries, entry)[0])) from exc
            if index.index_count > before:
                added += index.index_count - before
                self.dirty.add(self.names[-1])
            elif fresh:
                raise ValueError(f"index_count_max {self.index_count_max} leaves no room for an item")
        return added

    def drop_unsynced(self, durable_offset: int) -> int:
        """After an unclean stop: delete the files that may hold items a power cut lost, tore or left
        pointing at records the log lost (the newest, and any that reach past ``durable_offset``);
        returns where indexing must start again (the end of the newest file kept; 0 if none).

        Files wholly below the durable offset were flushed whole, header included (RocketMQ
        likewise destroys the index files newer than its checkpoint after an abnormal stop)."""
        assert self.writable
        dropped = 0
        while self.names:
            name = self.names[-1]
            # end_phy_offset is where the file's last record starts, not where it ends: a record
            # that starts at the durable offset is past it (durable offsets are record boundaries)
            if dropped and self.headers[name][3] < durable_offset:
                break
            mapped = self.mapped.pop(name, None)
            if mapped is not None:
                mapped.close()
            self._writing = None
            (self.directory / name).unlink()
            self.headers.pop(name, None)
            self.names.pop()
            self.dirty.discard(name)
            dropped += 1
        if dropped:
            fsync_dir(self.directory)
        return self.headers[self.names[-1]][3] if self.names else 0

    def _time_range(self, name: str) -> tuple[int, int]:
        index = self.mapped.get(name)
        if index is not None:
            return index.begin_timestamp_ms, index.end_timestamp_ms
        begin, end, _bp, _ep = self.headers[name]
        return begin, end

    def query(self, topic: str, key: str, *, count_max: int, begin_ms: int, end_ms: int) -> list[int]:
        """Offsets of candidate records, newest file first, without duplicates."""
        full_key = f"{topic}#{key}"
        seen: dict[int, None] = {}
        gone = False
        for name in reversed(self.names):
            if len(seen) >= count_max:
                break
            file_begin, file_end = self._time_range(name)
            if end_ms < file_begin or begin_ms > file_end:
                continue
            try:
                index = self.open(name)
            except FileNotFoundError:  # a reader's list: retention deleted the file since it was read
                gone = True
                continue
            for offset in index.select(full_key, count_max=count_max, begin_ms=begin_ms, end_ms=end_ms):
                seen.setdefault(offset, None)
            if file_begin < begin_ms:
                break
        if gone:
            self.refresh()
        return list(seen)[:count_max]

    def follow_writer(self) -> None:
        """Read-only: see what the builder added since the last call (the newest file's
        header), and look for a new file when there is none yet or the newest is full."""
        if not self.names or self.newest().reload_header() >= self.index_count_max:
            self.refresh()

    def flush(self) -> None:
        if self.names:
            self.newest().flush()

    def delete_before(self, log_min_offset: int) -> int:
        """Retention: delete files (never the newest) whose items all point below ``log_min_offset``."""
        deleted = 0
        for name in list(self.names[:-1]):
            index = self.mapped.get(name)
            end_phy = index.end_phy_offset if index is not None else self.headers[name][3]
            if end_phy >= log_min_offset:
                break
            if index is not None:
                self.mapped.pop(name).close()
            (self.directory / name).unlink(missing_ok=True)
            self.names.remove(name)
            self.headers.pop(name, None)
            self.dirty.discard(name)
            deleted += 1
        return deleted

    def take_dirty(self) -> set[str]:
        """Names of the files written since the last call (a roll can fill more than one)."""
        dirty, self.dirty = self.dirty, set()
        return dirty

    def close(self) -> None:
        self._writing = None
        for index in self.mapped.values():
            index.close()
        self.mapped = {}
