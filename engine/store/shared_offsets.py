"""A small mmap'd file of offsets that actors publish for each other to read.

One int64 slot per name; each slot has exactly one writing process, so an
aligned 8-byte store needs no lock. It lives in the run directory (not the
store): it describes the running engine, not the data.

    slot 0 written_offset     writer
    slot 1 confirmed_offset   writer
    slot 2 flushed_offset     flusher under ASYNC_FLUSH, writer under SYNC_FLUSH (its own syncs)
    slot 3 dispatched_offset  reput dispatcher
    slot 4 index_applied      index builder
    slot 5 min_offset         writer (start of the oldest segment)
    slot 6 last store time    writer (store timestamp of the last confirmed record, ms)
    slot 7 index durable      index builder (applied and flushed to disk)
    slot 8+k owner k applied  consume queue owner k
    slot 264+k owner k durable  consume queue owner k (applied and flushed to disk)
    slot 520 topic deletions   writer (bumped after each change of config/deletedTopics.json)
    slot 521 timers pending    timer (delayed messages stored and not delivered yet)
    slot 522 halves pending    transaction actor (half messages without a decision)
    slot 523 replicated        replication sender (what every in-sync replica holds: SYNC replication)
    slot 524 in-sync replicas  replication sender (how many replicas are in sync)
    slot 525 lease deadline    broker membership (CLOCK_MONOTONIC ms until which an elected master may append)
    slot 526 in-sync ids       replication sender (bit k: the replica with broker_id k is in sync here)
    slot 527 in-sync in etcd   broker membership (bit k: broker_id k is in the set etcd holds)
    slot 528 epoch             broker membership (the broker set's epoch this engine serves in)
    slot 529 run over          supervisor (1 once this file's run is over: the engine stopped, or a
                               new start found it and made a new file; a reader that maps it reads afresh)
    slot 530 send routes       front (the version of the run directory's ``send-routes`` file, stored once the
                               file is in place: ``engine/store/send_routes.py``)
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

OFFSETS_FILE = "offsets"
SLOT = struct.Struct("=q")
OWNERS_MAX = 256
SLOT_COUNT = 8 + 2 * OWNERS_MAX + 11
TOPIC_DELETIONS = 8 + 2 * OWNERS_MAX
TIMERS_PENDING = TOPIC_DELETIONS + 1
HALVES_PENDING = TOPIC_DELETIONS + 2
REPLICATED = TOPIC_DELETIONS + 3
IN_SYNC_REPLICAS = TOPIC_DELETIONS + 4
LEASE_DEADLINE = TOPIC_DELETIONS + 5
IN_SYNC_IDS = TOPIC_DELETIONS + 6
IN_SYNC_PUBLISHED = TOPIC_DELETIONS + 7
EPOCH = TOPIC_DELETIONS + 8
RUN_OVER = TOPIC_DELETIONS + 9
SEND_ROUTES = TOPIC_DELETIONS + 10
WRITTEN, CONFIRMED, FLUSHED, DISPATCHED, INDEX_APPLIED, MIN_OFFSET, LAST_STORE_TIMESTAMP, INDEX_DURABLE = range(8)
NAMES = {WRITTEN: "written_offset", CONFIRMED: "confirmed_offset", FLUSHED: "flushed_offset",
         DISPATCHED: "dispatched_offset", INDEX_APPLIED: "index_applied_offset", MIN_OFFSET: "min_offset",
         TIMERS_PENDING: "timers_pending", HALVES_PENDING: "halves_pending", REPLICATED: "replicated_offset",
         IN_SYNC_REPLICAS: "in_sync_replicas",
         EPOCH: "epoch"}


def owner_slot(instance: int) -> int:
    assert 0 <= instance < OWNERS_MAX
    return 8 + instance


def owner_durable_slot(instance: int) -> int:
    assert 0 <= instance < OWNERS_MAX
    return 8 + OWNERS_MAX + instance


class SharedOffsets:
    def __init__(self, run_dir: Path, *, writable: bool = True) -> None:
        """``writable=False``: a reader outside the engine (``engine/local_reads.py``) maps the file
        read-only; FileNotFoundError if no engine made it."""
        path = run_dir / OFFSETS_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT if writable else os.O_RDONLY, 0o600)
        try:
            if writable and os.fstat(fd).st_size < SLOT_COUNT * SLOT.size:
                os.posix_fallocate(fd, 0, SLOT_COUNT * SLOT.size)
            self.mm = mmap.mmap(fd, SLOT_COUNT * SLOT.size,
                                access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        finally:
            os.close(fd)

    def get(self, slot: int) -> int:
        value: int = SLOT.unpack_from(self.mm, slot * SLOT.size)[0]
        return value

    def set(self, slot: int, value: int) -> None:
        SLOT.pack_into(self.mm, slot * SLOT.size, value)

    def visible_end(self, *, sync_flush: bool, sync_replication: bool = False) -> int:
        """How far readers may see the log: confirmed, under SYNC_FLUSH also flushed, and under SYNC
        replication also held by every in-sync replica (RocketMQ's confirm offset: no reader sees
        a record that a failover could take back)."""
        end = self.get(CONFIRMED)
        if sync_flush:
            end = min(end, self.get(FLUSHED))
        if sync_replication:
            end = min(end, self.get(REPLICATED))
        return end

    def snapshot(self, owner_count: int) -> dict[str, int]:
        values = {name: self.get(slot) for slot, name in NAMES.items()}
        for k in range(owner_count):
            values[f"owner_{k}_applied_offset"] = self.get(owner_slot(k))
        return values

    @staticmethod
    def mark_run_over(run_dir: Path) -> None:
        """Tell the readers of the offsets file in ``run_dir`` (if any) that its run is over, before
        a new start replaces it (``RUN_OVER``)."""
        try:
            fd = os.open(run_dir / OFFSETS_FILE, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            if os.fstat(fd).st_size >= (RUN_OVER + 1) * SLOT.size:
                os.pwrite(fd, SLOT.pack(1), RUN_OVER * SLOT.size)
        finally:
            os.close(fd)

    def clear(self) -> None:
        """Every slot back to 0, as in the empty run directory of a new start."""
        self.mm[:] = bytes(len(self.mm))

    def close(self) -> None:
        self.mm.close()
