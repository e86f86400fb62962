"""The reput dispatcher: follows the log and tells queue owners and the index.

Woken by the writer after appends (never a sleep loop), it reads the
confirmed offset from the shared offsets and parses every record from its reput offset up to the confirmed offset (under
SYNC_FLUSH, up to the flushed offset: readers never see unflushed data) and
publishes ``DispatchBatch``es: to owner k (topic ``cq.<k>.``) the records of
its queues, to the index builder (``ix``) the records that carry keys.

Every batch names the log range it covers, and an empty batch goes out on
every tick, so a receiver that missed a batch (a restart, a full queue)
notices the gap and reads it from the log itself. Receivers are idempotent by
commit log offset, so a restarted dispatcher may start early without harm.
"""

from __future__ import annotations

import logging

from engine import codec
from engine.actors.base import Actor, Env, Handler, Port, main
from engine.actors.effects import Effects
from engine.codec_py import DispatchTuple
from engine.ipc import channels, endpoints
from engine.ipc.channels import Channel
from engine.ipc.messages import DispatchBatch, Wake
from engine.ipc.wire import Inbound
from engine.layout import END_FILE_MIN_BLANK_BYTES, Record
from engine.services.restart_points import reput_restart
from engine.store.checkpoint import CheckpointError, load_checkpoint
from engine.store.commit_log import CommitLogReader, Damage
from engine.store.shared_offsets import (
    CONFIRMED,
    DISPATCHED,
    FLUSHED,
    INDEX_APPLIED,
    MIN_OFFSET,
    REPLICATED,
    owner_slot,
)

log = logging.getLogger(__name__)


class ReputDispatcherActor(Actor):
    """Takes ``Wake``s on ``wakes``; gives ``DispatchBatch``es on ``dispatches``."""

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        cfg = env.config
        self.tick_interval_ms = cfg.dispatch_tick_interval_ms
        self.sync_flush = cfg.flush_mode == "SYNC_FLUSH"
        self.reader = CommitLogReader.for_config(env.store_dir, cfg)
        self.owner_count = cfg.consume_queue_owner_count
        self.index_uniq = cfg.index_uniq_key_enabled
        self.owner_topics = [endpoints.owner_topic(k) for k in range(self.owner_count)]
        self.reput_offset = 0
        self.confirmed_offset = 0
        self.flushed_offset = 0
        self.damaged_ranges = 0
        self.log_min_offset = 0

    def ports(self) -> list[Port]:
        # Under SYNC_FLUSH readers see only flushed bytes: the writer wakes us after each of its syncs.
        return [Port(channels.DISPATCH, bind=True, hwm=max(self.config.socket_hwm_messages, 100_000)),
                Port(channels.CONFIRMED, bind=False, subscribe=(endpoints.TOPIC_CONFIRMED,))]

    def recover(self, out: Effects) -> None:
        slots = self.slots
        applied = [slots.get(owner_slot(k)) for k in range(self.owner_count)] + [slots.get(INDEX_APPLIED)]
        try:
            checkpoint = load_checkpoint(self.env.store_dir)
        except CheckpointError:
            checkpoint = None
        self.reput_offset = reput_restart(applied, dispatched=checkpoint.dispatched_offset if checkpoint else 0,
                                          log_min=self.reader.min_offset())
        self.follow_log()
        self.sent_end = [self.reput_offset] * (self.owner_count + 1)  # per owner, then the index
        log.info("reput starts at %d (confirmed %d)", self.reput_offset, self.confirmed_offset)

    def handlers(self) -> dict[type, Handler]:
        return {Wake: self.on_wake}

    def on_wake(self, _wake: Wake, _inbound: Inbound, _out: Effects) -> None:
        """A ``Wake``: what it announces is read from the shared offsets once the queue is drained."""

    def drained(self, channel: Channel, out: Effects) -> None:
        self.follow_log()
        self.dispatch(out)

    def follow_log(self) -> None:
        """Read how far the log is confirmed (and flushed) from the shared offsets."""
        offsets = self.slots
        confirmed = offsets.get(CONFIRMED)
        if confirmed < self.reput_offset:
            # A restarted writer cut a torn tail we had not dispatched past; follow it.
            self.reput_offset = max(confirmed, self.reader.min_offset())
        self.confirmed_offset = confirmed
        self.flushed_offset = offsets.get(FLUSHED)

    @property
    def end_offset(self) -> int:
        """How far readers may see: confirmed, under SYNC_FLUSH also flushed, under SYNC replication
        also held by the in-sync replicas."""
        end = min(self.confirmed_offset, self.flushed_offset) if self.sync_flush else self.confirmed_offset
        return min(end, self.slots.get(REPLICATED)) if self.config.reads_wait_for_replicas else end

    def dispatch(self, out: Effects) -> None:
        """Publish up to ``dispatch_batches_per_turn_max`` batches; the loop comes back for the rest."""
        end = self.end_offset
        for _ in range(self.config.dispatch_batches_per_turn_max):
            if self.reput_offset >= end:
                return
            per_owner, for_index, position = self.collect(self.reput_offset, end)
            self.publish(out, position, per_owner, for_index)
            self.reput_offset = position

    def backlog(self) -> bool:
        return self.reput_offset < self.end_offset

    def work_backlog(self, out: Effects) -> None:
        self.dispatch(out)

    def collect(self, start: int, end: int) -> tuple[list[bytearray], bytearray, int]:
        """Parse up to ``dispatch_batch_records_max`` records from ``start``: the entries for
        each owner and for the index, packed, and the offset after the last record parsed."""
        per_owner = [bytearray() for _ in range(self.owner_count)]
        for_index = bytearray()
        room = self.config.dispatch_batch_records_max
        offset = start
        while offset < end and room > 0:
            segment = self.reader.segment_at(offset)
            if segment is None:
                self.report_damage(Damage(offset, end, "missing segment"))
                return per_owner, for_index, end
            base = segment.start_offset
            limit = min(segment.size_bytes, end - base)
            owners, index, count, pos, stop = codec.scan_dispatch(segment.mm, offset - base, limit, base, room,
                                                                  self.owner_count, self.index_uniq, True)
            for mine, found in zip(per_owner, owners, strict=True):
                mine.extend(found)
            for_index += index
            room -= count
            offset = base + pos
            if stop == codec.SCAN_DAMAGE:
                offset = self.step_over(offset, end, per_owner, for_index)
                room -= 1
            elif stop == codec.SCAN_BLANK or limit - pos < END_FILE_MIN_BLANK_BYTES:
                offset = segment.end_offset
        return per_owner, for_index, min(offset, end)

    def step_over(self, offset: int, end: int, per_owner: list[bytearray], for_index: bytearray) -> int:
        """The record at ``offset`` did not parse on the fast path: let the full decoder say why."""
        item = next(iter(self.reader.scan(offset, end, check_crc=False)))
        if isinstance(item, Damage):
            self.report_damage(item)
            return item.end
        self.route(item, per_owner, for_index)
        return item.commit_log_offset + item.total_size

    def route(self, record: Record, per_owner: list[bytearray], for_index: bytearray) -> None:
        keys = record.keys
        uniq = record.uniq_key if self.index_uniq else None
        entry: DispatchTuple = (record.topic, record.queue_id, record.queue_offset, record.commit_log_offset,
                                record.total_size, codec.tags_code(record.tags), record.store_timestamp_ms, [])
        per_owner[codec.owner_index(record.topic, record.queue_id, self.owner_count)] += codec.pack_entry(entry)
        if keys or uniq:
            for_index += codec.pack_entry((*entry[:7], [uniq, *keys] if uniq else keys))

    def publish(self, out: Effects, end: int, per_owner: list[bytearray], for_index: bytearray,
                *, tick: bool = False) -> None:
        """Send each receiver what it has in the log up to ``end``; a receiver with nothing new
        hears nothing until the next tick (its batch then starts where its last one ended)."""
        receivers = [*zip(self.owner_topics, per_owner, strict=True), (endpoints.TOPIC_INDEX, for_index)]
        for k, (topic, packed) in enumerate(receivers):
            if packed or tick:
                out.publish(channels.DISPATCH, topic, DispatchBatch(self.sent_end[k], end, bytes(packed)))
                self.sent_end[k] = end
        self.slots.set(DISPATCHED, end)

    def report_damage(self, damage: Damage) -> None:
        self.damaged_ranges += 1
        log.error("DAMAGED COMMIT LOG: bytes [%d, %d) hold no valid record (%s); skipped, later records dispatched",
                  damage.start, damage.end, damage.reason)

    def tick(self, out: Effects) -> None:
        log_min = self.slots.get(MIN_OFFSET)
        if log_min > self.log_min_offset:  # retention deleted segments: let their mappings go
            self.log_min_offset = log_min
            self.reader.segments.refresh()
        self.follow_log()
        self.dispatch(out)
        self.publish(out, self.reput_offset, [bytearray() for _ in range(self.owner_count)], bytearray(), tick=True)

    def detail(self) -> dict[str, int]:
        return {"reput_offset": self.reput_offset, "confirmed_offset": self.confirmed_offset,
                "damaged_ranges": self.damaged_ranges}

    def shutdown(self, out: Effects) -> None:
        self.follow_log()
        self.dispatch(out)
        self.publish(out, self.reput_offset, [bytearray() for _ in range(self.owner_count)], bytearray(), tick=True)


if __name__ == "__main__":
    raise SystemExit(main(ReputDispatcherActor))
