"""The index builder: maintains the IndexFiles.

Applies ``DispatchBatch``es from the reput dispatcher (SUB ``ix``): every
record's UNIQ_KEY and KEYS become items ``topic#key``. Lookups are answered by
the front, which maps the files read-only (``engine/services/front/key_lookup.py``). Records
of a deleted topic written before its deletion stay in the IndexFiles
(RocketMQ never drops items); lookups never return them.

Recovery: the newest file's half-added item (if a kill left one) is unlinked;
then records from ``max(checkpoint dispatched offset, end_phy_offset)`` are
indexed again from the log. After an unclean stop (a power cut may have lost
or torn items, or left items pointing at records the log lost) the newest
files are deleted instead and indexed again (``IndexService.drop_unsynced``).
A record indexed twice is harmless, as queries return each offset once.

Files dropped below the checkpoint's dispatched offset (the newest goes even when it lies wholly
below it) make that offset untrue for the index until it is indexed again, and the checkpoint
never goes down. ``index/reindex`` says so meanwhile (``kept_end dispatched``): a restart of this
actor alone starts from ``kept_end``, not from the checkpoint, until the index is durable past
``dispatched`` again. Under SYNC replication that can take long (readers, and so the catch-up,
wait for the replicas), and an index builder killed in between lost its items for good.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from engine.actors.base import Actor, Env, Handler, Port, main
from engine.actors.effects import Effects
from engine.codec_py import DispatchTuple
from engine.ipc import channels, endpoints
from engine.ipc.endpoints import CRASH_START_FILE
from engine.ipc.messages import DispatchBatch
from engine.ipc.wire import Inbound
from engine.services.log_slices import read_slice
from engine.services.restart_points import index_restart, index_restart_unclean
from engine.store.atomic_file import write_atomically
from engine.store.checkpoint import CheckpointError, load_checkpoint
from engine.store.commit_log import CommitLogReader
from engine.store.index_file import IndexService, IndexStalled
from engine.store.shared_offsets import CONFIRMED, INDEX_APPLIED, INDEX_DURABLE, MIN_OFFSET

log = logging.getLogger(__name__)
REINDEX_FILE = "reindex"  # in the index directory: "kept_end dispatched" while the index is below the checkpoint


class IndexBuilderActor(Actor):
    """Takes ``DispatchBatch``es on ``dispatches``; gives no replies."""

    drain_at_stop = (channels.DISPATCH,)

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        cfg = env.config
        self.reader = CommitLogReader.for_config(env.store_dir, cfg)
        self.index = IndexService(env.store_dir, hash_slot_count=cfg.index_hash_slot_count,
                                  index_count_max=cfg.index_item_count_max, writable=True,
                                  reserve_step_bytes=cfg.index_reserve_step_bytes)
        self.applied_offset = 0
        self.stalled = False
        self.behind = False  # catch-up stopped at its per-turn budget: the loop goes on with it
        self.log_min_offset = 0
        self.syncer = env.syncer(env.name, lambda offset: env.slots.set(INDEX_DURABLE, offset))
        self.last_flush_ms = self.clock.mono_ms()
        self.sync_flush = cfg.flush_mode == "SYNC_FLUSH"
        self.reindex_path = self.index.directory / REINDEX_FILE
        self.reindex_until = 0  # while ``index/reindex`` stands: the dispatched offset it waits for

    def ports(self) -> list[Port]:
        return [Port(channels.DISPATCH, bind=False, subscribe=(endpoints.TOPIC_INDEX,),
                     hwm=100_000)]

    @property
    def visible_end(self) -> int:
        return self.slots.visible_end(sync_flush=self.sync_flush, sync_replication=self.config.reads_wait_for_replicas)

    def recover(self, out: Effects) -> None:
        try:
            checkpoint = load_checkpoint(self.env.store_dir)
        except CheckpointError:
            checkpoint = None
        dispatched = checkpoint.dispatched_offset if checkpoint else 0
        reindex = self.load_reindex()
        unclean = (self.env.run_dir / CRASH_START_FILE).exists()
        if unclean:  # a power cut may have lost, torn or outdated the newest files' items
            if self.index.file_count and dispatched:
                self.save_reindex(0, dispatched)  # until the drop says how far it kept
            kept_end = self.index.drop_unsynced(dispatched)
            if reindex:  # an earlier drop not indexed again yet
                kept_end, dispatched = min(kept_end, reindex[0]), max(dispatched, reindex[1])
            log.warning("unclean stop: index files past %d deleted; indexing again from there", kept_end)
            if kept_end < dispatched:
                self.save_reindex(kept_end, dispatched)
            else:
                self.reindex_path.unlink(missing_ok=True)
            self.applied_offset = index_restart_unclean(kept_end, log_min=self.reader.min_offset(),
                                                        confirmed=self.slots.get(CONFIRMED))
        else:
            if reindex:
                self.reindex_until = reindex[1]
            self.applied_offset = index_restart(self.index.end_phy_offset,
                                                dispatched=reindex[0] if reindex else dispatched,
                                                log_min=self.reader.min_offset(), confirmed=self.slots.get(CONFIRMED))
        self.catch_up(self.visible_end)
        # After a kill the catch-up is short: all of it before running. After an unclean stop it
        # may be a whole file's worth; the loop's backlog does it in slices, with heartbeats.
        while self.behind and not unclean:
            self.catch_up(self.visible_end)
        self.slots.set(INDEX_APPLIED, self.applied_offset)
        if self.index.file_count:
            self.syncer.mark(self.index.directory / self.index.names[-1])  # a predecessor's last writes
        self.flush_index(wait=True)
        log.info("index recovered: %d files, applied up to %d", self.index.file_count, self.applied_offset)

    def load_reindex(self) -> tuple[int, ...]:
        try:
            kept_end, until = (int(n) for n in self.reindex_path.read_text().split())
        except (FileNotFoundError, ValueError):
            return ()
        return kept_end, until

    def save_reindex(self, kept_end: int, until: int) -> None:
        write_atomically(self.reindex_path, f"{kept_end} {until}".encode())
        self.reindex_until = until

    def catch_up(self, end: int) -> None:
        """Index [applied_offset, end) straight from the log, ``catch_up_bytes_per_turn_max`` a call."""
        start = self.applied_offset
        self.behind = False
        if end <= start:
            return
        piece = read_slice(self.reader, start, end, self.config.catch_up_bytes_per_turn_max, 1,
                           index_uniq=self.config.index_uniq_key_enabled)
        if not self.apply(piece.for_index, start):
            return
        self.applied_offset, self.behind = piece.end, piece.end < end

    def apply(self, entries: Sequence[DispatchTuple] | bytes, min_offset: int) -> bool:
        """Index the records at or past ``min_offset``; on a full disk stop at the record it could
        not take (False) and retry from it later."""
        try:
            self.index.build_records(entries, min_offset)
        except IndexStalled as stall:
            if not self.stalled:
                log.error("cannot write the index: %s; retrying from offset %d", stall.__cause__,
                          stall.commit_log_offset)
            self.stalled = True
            self.applied_offset = stall.commit_log_offset
            return False
        self.stalled = False
        return True

    def handlers(self) -> dict[type, Handler]:
        return {DispatchBatch: self.on_batch}

    def on_batch(self, batch: DispatchBatch, _inbound: Inbound, out: Effects) -> None:
        if batch.end <= self.applied_offset:
            return
        if batch.start > self.applied_offset:
            if self.behind:
                return  # the backlog's catch-up reads this batch's records from the log
            self.catch_up(batch.start)
        if self.stalled or self.behind:
            return  # the tick (or the next turn) goes on from the record it reached
        if not self.apply(batch.packed, self.applied_offset):
            return
        self.applied_offset = batch.end
        self.slots.set(INDEX_APPLIED, self.applied_offset)

    def flush_index(self, *, wait: bool = False) -> None:
        """Flush the index files written since the last flush (in the background); then say so."""
        for name in self.index.take_dirty():
            self.syncer.mark(self.index.directory / name)
        if wait:
            self.syncer.flush_now(self.applied_offset)
        else:
            self.syncer.request(self.applied_offset)

    def tick(self, out: Effects) -> None:
        now_ms = self.clock.mono_ms()
        log_min = self.slots.get(MIN_OFFSET)
        if log_min > self.log_min_offset:
            self.log_min_offset = log_min
            self.reader.segments.refresh()
            if self.index.delete_before(log_min):
                log.info("retention: index files below %d deleted", log_min)
        if now_ms - self.last_flush_ms >= self.config.flush_consume_queue_interval_ms:
            self.last_flush_ms = now_ms
            self.flush_index()
        if self.stalled:
            self.catch_up(self.visible_end)
        self.slots.set(INDEX_APPLIED, self.applied_offset)
        if self.reindex_until and self.slots.get(INDEX_DURABLE) >= self.reindex_until:
            self.reindex_path.unlink(missing_ok=True)  # the checkpoint holds for the index again
            self.reindex_until = 0

    def backlog(self) -> bool:
        return self.behind

    def work_backlog(self, out: Effects) -> None:
        self.catch_up(self.visible_end)
        self.slots.set(INDEX_APPLIED, self.applied_offset)

    def detail(self) -> dict[str, int]:
        return {"applied_offset": self.applied_offset, "index_files": self.index.file_count}

    def shutdown(self, out: Effects) -> None:
        self.catch_up(self.visible_end)
        while self.behind:
            self.catch_up(self.visible_end)
        self.slots.set(INDEX_APPLIED, self.applied_offset)
        self.flush_index(wait=True)
        self.syncer.close()
        self.index.close()


if __name__ == "__main__":
    raise SystemExit(main(IndexBuilderActor))
