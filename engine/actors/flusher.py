"""The flush/checkpoint actor: makes the log, queues and index durable.

* CommitLog, under ASYNC_FLUSH: flushed every ``flush_interval_ms`` when at
  least ``flush_least_pages`` pages are dirty, and everything every
  ``flush_thorough_interval_ms``. Each flush is stored in the shared offsets
  and its readers are woken (PUB ``flushed``). Under SYNC_FLUSH the writer
  syncs its own appends (one wake-up per durable send) and stores the flushed
  offset itself; this actor only reads it, for the checkpoint.
* Queues and index: their owners flush their own files every
  ``flush_consume_queue_interval_ms`` and publish how far that made them
  durable; the smallest of those becomes the checkpoint's ``dispatched_offset``.
* The checkpoint is rewritten every ``checkpoint_interval_ms``.

The flusher writes through no mapping: ``fdatasync`` on its own descriptor
flushes the pages that the writer dirtied through its mapping.
A failed flush is never retried (fsyncgate): the actor exits, the supervisor
restarts it, and nothing past the last good flush was acknowledged as durable.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import replace
from pathlib import Path

from engine.actors.base import Actor, Env, Handler, Port, main
from engine.actors.effects import Effects
from engine.ipc import channels, endpoints
from engine.ipc.messages import FlushFailed, Wake, encoder
from engine.layout import offset_to_file_name
from engine.logs import event
from engine.metrics.report import Figures, Histogram
from engine.services.restart_points import (
    checkpoint_dispatched,
    checkpoint_within_log,
    dispatched_on_disk,
    flusher_restart,
)
from engine.store import sync
from engine.store.checkpoint import Checkpoint, CheckpointError, load_checkpoint, store_checkpoint
from engine.store.commit_log import COMMIT_LOG_DIR, CommitLogReader
from engine.store.consume_queue import list_queues
from engine.store.mapped_file import PAGE_BYTES
from engine.store.shared_offsets import CONFIRMED, FLUSHED, INDEX_DURABLE, LAST_STORE_TIMESTAMP, owner_durable_slot

log = logging.getLogger(__name__)
_TIMESTAMPS_KEPT = 4096
_WAKE = encoder.encode(Wake())


class FlusherActor(Actor):
    """Takes nothing; gives ``Wake``s and ``FlushFailed`` on ``flushed`` (ASYNC_FLUSH)."""

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        cfg = env.config
        self.sync_flush = cfg.flush_mode == "SYNC_FLUSH"
        self.tick_interval_ms = min(cfg.flush_interval_ms, cfg.flush_consume_queue_interval_ms,
                                    cfg.checkpoint_interval_ms)
        self.confirmed_offset = 0
        self.flushed_offset = 0
        self.timestamps: deque[tuple[int, int]] = deque(maxlen=_TIMESTAMPS_KEPT)
        self.segment_fds: dict[int, int] = {}
        self.checkpoint = Checkpoint()  # what the next write stores
        self.stored = Checkpoint()  # what the file holds
        self.failed = False  # a flush failed: the process ends once this call's effects are out
        self.flush_seconds = Histogram.new()  # for metrics: each flush round, and each fdatasync in it
        self.fdatasync_seconds = Histogram.new()
        self.last_thorough_ms = self.last_queue_flush_ms = self.last_checkpoint_ms = self.clock.mono_ms()

    def ports(self) -> list[Port]:
        return [Port(channels.FLUSHED, bind=True)]  # the interval decides: the ticks read the writer's offsets

    def recover(self, out: Effects) -> None:
        try:
            self.checkpoint = self.stored = load_checkpoint(self.env.store_dir) or Checkpoint()
        except CheckpointError as exc:
            log.error("checkpoint unusable (%s); starting a new one", exc)
        self.confirmed_offset = self.slots.get(CONFIRMED)  # the writer recovered first
        if self.sync_flush:  # the writer synced what it recovered
            self.flushed_offset = self.slots.get(FLUSHED)
        else:  # what the writer recovered may never have been flushed (a killed engine): flush it now
            self.flushed_offset = flusher_restart(self.checkpoint.flushed_offset, self.confirmed_offset)
            self.flush_commit_log(out, self.confirmed_offset)
        dispatched = checkpoint_within_log(self.checkpoint.dispatched_offset, self.confirmed_offset)
        if dispatched != self.checkpoint.dispatched_offset:
            log.warning("the log ends at %d, before the checkpoint's dispatched offset %d (a power cut took "
                        "its tail): the checkpoint follows it down", self.confirmed_offset,
                        self.checkpoint.dispatched_offset)
            self.checkpoint = replace(self.checkpoint, dispatched_offset=dispatched)
            self.write_checkpoint()  # before the owners and the index builder read it
        self.follow_lost_queues()

    def follow_lost_queues(self) -> None:
        """With the ConsumeQueues lost, the checkpoint's dispatched offset goes down to the log's
        start before the owners read it: they build every queue again from there, and a kill
        half-way has them go on from what they made durable, never from the old offset."""
        dispatched = self.checkpoint.dispatched_offset
        reader = CommitLogReader.for_config(self.env.store_dir, self.config)
        try:
            log_min = reader.min_offset()
        finally:
            reader.segments.close()
        rebuilt_from = dispatched_on_disk(dispatched, queues_on_disk=len(list_queues(self.env.store_dir)),
                                          log_min=log_min)
        if rebuilt_from < dispatched:
            log.warning("no ConsumeQueue on disk, while the checkpoint says the log was dispatched up to %d: "
                        "every queue is built again from the log from %d", dispatched, rebuilt_from)
            self.checkpoint = replace(self.checkpoint, dispatched_offset=rebuilt_from)
            self.write_checkpoint()

    def handlers(self) -> dict[type, Handler]:
        return {}

    def follow_confirmed(self) -> None:
        """Read the writer's confirmed offset and the store time of its last record."""
        # The time first: the writer stores it before the offset, so the pair never
        # gives an offset a later record's time.
        store_timestamp = self.slots.get(LAST_STORE_TIMESTAMP)
        confirmed = self.slots.get(CONFIRMED)
        if confirmed == self.confirmed_offset:
            return
        if confirmed < self.confirmed_offset:
            # A restarted writer cut a torn tail; nothing below it was ever confirmed to us.
            self.flushed_offset = min(self.flushed_offset, confirmed)
        self.confirmed_offset = confirmed
        self.timestamps.append((confirmed, store_timestamp))

    def segment_path(self, start: int) -> Path:
        return self.env.store_dir / COMMIT_LOG_DIR / offset_to_file_name(start)

    def _segment_fd(self, start: int) -> int | None:
        fd = self.segment_fds.get(start)
        if fd is None:
            try:
                fd = os.open(self.segment_path(start), os.O_RDONLY)
            except FileNotFoundError:
                return None
            self.segment_fds[start] = fd
        return fd

    def flush_commit_log(self, out: Effects, target: int) -> None:
        """fdatasync every segment between the flushed offset and ``target``; exit on failure."""
        if target <= self.flushed_offset:
            self.publish_flushed(out)
            return
        size = self.config.segment_size_bytes
        start = self.flushed_offset - self.flushed_offset % size
        began = time.perf_counter()
        for segment in range(start, target, size):
            fd = self._segment_fd(segment)
            if fd is None:
                continue
            synced = time.perf_counter()
            try:
                sync.fdatasync(fd, self.segment_path(segment))
            except OSError as exc:
                self.fail_stop(out, f"fdatasync of segment {segment}: {exc}")
                return
            self.fdatasync_seconds.observe(time.perf_counter() - synced)
        self.flush_seconds.observe(time.perf_counter() - began)
        for segment in [s for s in self.segment_fds if s + size <= target - target % size and s < start]:
            os.close(self.segment_fds.pop(segment))
        self.flushed_offset = target
        self.publish_flushed(out)

    def publish_flushed(self, out: Effects) -> None:
        self.slots.set(FLUSHED, self.flushed_offset)
        out.publish(channels.FLUSHED, endpoints.TOPIC_FLUSHED, _WAKE)

    def fail_stop(self, out: Effects, reason: str) -> None:
        """Never retry a failed flush (fsyncgate): tell the writer, then exit so recovery runs."""
        log.critical("flush failed: %s; the writer stops acknowledging and both restart", reason,
                     extra=event("flush.failed", reason=reason, flushed_offset=self.flushed_offset))
        out.publish(channels.FLUSHED, endpoints.TOPIC_FLUSHED, FlushFailed(reason))
        out.exit(71, f"flush failed: {reason}")
        self.failed = True

    def _timestamp_at(self, offset: int) -> int:
        best = 0
        for confirmed, ts in self.timestamps:
            if confirmed <= offset:
                best = ts
        return best

    def durable_dispatched_offset(self) -> int:
        """How far every owner and the index builder applied the log *and* flushed their files.

        Each of them flushes its own files and publishes this in the shared offsets, so
        the checkpoint's dispatched offset never promises units that are not on disk.
        """
        owners = [self.slots.get(owner_durable_slot(k)) for k in range(self.config.consume_queue_owner_count)]
        return checkpoint_dispatched([*owners, self.slots.get(INDEX_DURABLE)],
                                     self.checkpoint.dispatched_offset)

    def tick(self, out: Effects) -> None:
        now_ms = self.clock.mono_ms()
        cfg = self.config
        self.follow_confirmed()
        if self.sync_flush:
            self.flushed_offset = self.slots.get(FLUSHED)  # the writer's own sync
        elif self.confirmed_offset > self.flushed_offset:
            thorough = now_ms - self.last_thorough_ms >= cfg.flush_thorough_interval_ms
            dirty_pages = self.confirmed_offset // PAGE_BYTES - self.flushed_offset // PAGE_BYTES
            if thorough or dirty_pages >= cfg.flush_least_pages:
                self.flush_commit_log(out, self.confirmed_offset)
                if self.failed:
                    return
                if thorough:
                    self.last_thorough_ms = now_ms
        if now_ms - self.last_queue_flush_ms >= cfg.flush_consume_queue_interval_ms:
            self.last_queue_flush_ms = now_ms
            applied = self.durable_dispatched_offset()
            if applied > self.checkpoint.dispatched_offset:
                self.checkpoint = replace(self.checkpoint, dispatched_offset=applied,
                                           logics_msg_timestamp_ms=self._timestamp_at(applied),
                                           index_msg_timestamp_ms=self._timestamp_at(applied))
        if now_ms - self.last_checkpoint_ms >= cfg.checkpoint_interval_ms:
            self.last_checkpoint_ms = now_ms
            self.write_checkpoint()

    def write_checkpoint(self) -> None:
        flushed = min(self.flushed_offset, self.confirmed_offset) if self.confirmed_offset else self.flushed_offset
        updated = replace(self.checkpoint, flushed_offset=flushed, confirm_phy_offset=flushed,
                           physic_msg_timestamp_ms=self._timestamp_at(flushed) or
                           self.checkpoint.physic_msg_timestamp_ms)
        if updated != self.stored:  # the dispatched offset may have moved alone since the last write
            try:
                store_checkpoint(self.env.store_dir, updated)
            except OSError as exc:
                # The checkpoint only shortens recovery; without it recovery scans further.
                log.error("cannot write the checkpoint: %s", exc, extra=event("checkpoint.write_failed",
                                                                             reason=str(exc)))
                return
            self.checkpoint = self.stored = updated

    def detail(self) -> dict[str, int]:
        return {"flushed_offset": self.flushed_offset, "confirmed_offset": self.confirmed_offset,
                "dispatched_offset": self.checkpoint.dispatched_offset}

    def metrics(self) -> Figures:
        if self.sync_flush:  # the writer flushes the log, and reports rmqpy_flush_seconds itself
            return {}
        return {"rmqpy_flush_seconds": self.flush_seconds, "rmqpy_fdatasync_seconds": self.fdatasync_seconds}

    def shutdown(self, out: Effects) -> None:
        self.follow_confirmed()
        if self.sync_flush:
            self.flushed_offset = self.slots.get(FLUSHED)
        elif self.confirmed_offset > self.flushed_offset:
            self.flush_commit_log(out, self.confirmed_offset)
        applied = self.durable_dispatched_offset()
        self.checkpoint = replace(self.checkpoint, dispatched_offset=applied,
                                   logics_msg_timestamp_ms=self._timestamp_at(applied) or
                                   self.checkpoint.logics_msg_timestamp_ms)
        self.write_checkpoint()
        for fd in self.segment_fds.values():
            os.close(fd)


if __name__ == "__main__":
    raise SystemExit(main(FlusherActor))
