"""Rebuild the derived files (ConsumeQueues and IndexFiles) of a stopped store from its CommitLog.

The old ``consumequeue/`` and ``index/`` are kept as evidence in
``broken-<time>/`` (as etcd's WAL repair keeps ``.broken`` files); the new
ones are written from every intact record of the log (except the records
of deleted topics written before their deletion), and the checkpoint's
dispatched offset is set to the end of the log. The store's lock is taken
first: a running engine's files are never touched.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine.config import StoreConfig
from engine.layout import Record, tags_code
from engine.offline.inspect_store import PROGRESS_STEP_BYTES, Progress, _quiet, detect_config
from engine.offline.log_scan import scan_log
from engine.offline.store_dir import require_store
from engine.store.checkpoint import Checkpoint, CheckpointError, load_checkpoint, store_checkpoint
from engine.store.commit_log import CommitLogReader, Damage
from engine.store.consume_queue import CONSUME_QUEUE_DIR, ConsumeQueue
from engine.store.deleted_topics import DeletedTopics
from engine.store.index_file import INDEX_DIR, IndexService


class StoreBusy(RuntimeError):
    """An engine is running on the store."""


@dataclass
class RepairReport:
    records: int
    damaged_ranges: int
    log_end: int
    evidence_dir: Path


@contextmanager
def store_locked(store_dir: Path) -> Iterator[None]:
    """Hold the store's lock (as a running engine does); StoreBusy if an engine holds it."""
    lock_fd = os.open(store_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreBusy(f"an engine is running on {store_dir}; stop it first") from None
        yield
    finally:
        os.close(lock_fd)


def move_derived_aside(store_dir: Path) -> Path:
    """Move ``consumequeue/`` and ``index/`` into a new ``broken-<time>/``; return it."""
    evidence = store_dir / f"broken-{time.strftime('%Y%m%d-%H%M%S')}"
    evidence.mkdir()
    for name in (CONSUME_QUEUE_DIR, INDEX_DIR):
        if (store_dir / name).exists():
            os.rename(store_dir / name, evidence / name)
    return evidence


def mark_dispatched(store_dir: Path, log_end: int) -> None:
    """The derived files now hold the whole log: the checkpoint's dispatched offset is its end."""
    try:
        checkpoint = load_checkpoint(store_dir) or Checkpoint()
    except CheckpointError:
        checkpoint = Checkpoint()
    store_checkpoint(store_dir, dataclasses.replace(checkpoint, dispatched_offset=log_end,
                                                    flushed_offset=min(checkpoint.flushed_offset, log_end)))


def rebuild_derived(store_dir: Path, config: StoreConfig | None = None, *,
                    progress: Progress = _quiet) -> RepairReport:
    """``progress("log", bytes read, bytes to read)`` is called as the log is read (a bar on a terminal).

    NotAStore if ``store_dir`` is not a store, StoreBusy if an engine runs on it: nothing is written then."""
    require_store(store_dir)
    config = detect_config(store_dir, config or StoreConfig())
    with store_locked(store_dir):
        return _rebuild(store_dir, config, progress)


def _rebuild(store_dir: Path, config: StoreConfig, progress: Progress) -> RepairReport:
    evidence = move_derived_aside(store_dir)
    reader = CommitLogReader.for_config(store_dir, config)
    index = IndexService(store_dir, hash_slot_count=config.index_hash_slot_count,
                         index_count_max=config.index_item_count_max, writable=True,
                         reserve_step_bytes=config.index_reserve_step_bytes)
    queues: dict[tuple[str, int], ConsumeQueue] = {}
    deleted = DeletedTopics(store_dir)
    records = damaged = pending = 0
    log_end = reader.min_offset()
    last = reader.segments.last_offset()
    if last is not None:
        first, end = reader.min_offset(), last + config.segment_size_bytes
        next_report = first
        for item in scan_log(reader, check_crc=True):  # each segment up to its data end
            if isinstance(item, Damage):
                pending += 1  # damage counts once a valid record follows (else it is a torn tail)
                continue
            assert isinstance(item, Record)
            if item.commit_log_offset >= next_report:
                progress("log", item.commit_log_offset - first, end - first)
                next_report = item.commit_log_offset + PROGRESS_STEP_BYTES
            damaged, pending = damaged + pending, 0
            log_end = item.commit_log_offset + item.total_size
            if deleted.hides(item.topic, item.commit_log_offset):
                continue  # its topic was deleted after it was written
            key = (item.topic, item.queue_id)
            cq = queues.get(key) or queues.setdefault(key, ConsumeQueue(
                store_dir, *key, file_units=config.consume_queue_file_units, writable=True,
                reserve_step_bytes=config.consume_queue_reserve_step_bytes))
            cq.put(item.queue_offset, item.commit_log_offset, item.total_size, tags_code(item.tags))
            keys = [*([item.uniq_key] if item.uniq_key else []), *item.keys]
            if keys:
                index.build(item.topic, keys, item.commit_log_offset, item.store_timestamp_ms)
            records += 1
    for cq in queues.values():
        cq.flush()
        cq.close()
    index.flush()
    index.close()
    reader.segments.close()
    if last is not None:
        progress("log", end - first, end - first)
    mark_dispatched(store_dir, log_end)
    return RepairReport(records, damaged, log_end, evidence)
