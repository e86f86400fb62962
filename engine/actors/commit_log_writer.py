"""The CommitLog writer: the only process that appends to the log.

Receives sends forwarded by the front (ROUTER ``writer.sock``), validates
them, assigns queue offsets (one counter per topic-queue, rebuilt from the
log at start) and commit log offsets, appends the batch into the mapped
segment, then stores the new confirmed offset in the shared offsets, wakes
its followers (PUB ``writer-pub.sock``) and answers.

It also decides where a topic deletion falls in the log (``delete_topic``,
see ``engine/store/deleted_topics.py``): the front forwards the request here so
that every send routed before it lies below the deletion offset.

A client that knows the route may send straight to the writer's own port (``replies-writer``,
``direct_sends_enabled``): the writer checks such a send as the front would, over the topic table
the front saved, and chooses its queue (``engine/services/writer/direct_sends.py``); what only
the front decides is passed back to the client (ROUTE_VIA_FRONT, nothing stored).

Under ASYNC_FLUSH a send is answered once its records are in the mapping (the
flusher flushes the log on its interval).
Under SYNC_FLUSH the writer syncs its own appends: after each run of sends its
flush thread fdatasyncs what they added and wakes the loop, which stores the
flushed offset, answers every send the sync covers (group commit: one sync
covers every batch appended meanwhile) and wakes the dispatcher; a send whose
sync has not come within ``sync_flush_timeout_ms`` is answered
FLUSH_DISK_TIMEOUT, and a failed sync stops the writer (fsyncgate).

At a stop, the requests still queued are answered SERVICE_NOT_AVAILABLE, nothing of them done
(``refuse_at_stop``), and every send waiting for the flush or the replicas gets its answer once
the last flush is made (``answer_waiting_sends``).

This module is the writer's handler glue; its jobs are in ``engine/services/writer/``:
``log_appends.py`` (a send checked, given its queue offsets and appended),
``sync_acks.py`` (the sends waiting for the flush, and the writer's own sync),
``deletion_records.py`` (the
deletion table's group commit) and ``retention_rounds.py`` (deleting old segments).
"""

from __future__ import annotations

import logging
from pathlib import Path

from engine import codec
from engine.actors.base import Actor, Env, Handler, Port, main
from engine.actors.effects import Effects
from engine.errors import ErrorCode, PutStatus, RequestError
from engine.ipc import channels, endpoints
from engine.ipc.channels import Channel, ClientFrame
from engine.ipc.endpoints import CRASH_START_FILE, REPLICA_APPEND_LOCK
from engine.ipc.messages import (
    Append,
    DeleteTopic,
    FlushFailed,
    ReplicaAppend,
    ReplicaAppended,
    ReplicaDeletions,
    TopicDeletion,
    Wake,
    encoder,
)
from engine.ipc.protocol import (
    DeleteTopicRequest,
    SendRequest,
    decode_as,
    decode_envelope,
    encode_error,
    encode_reply,
    encode_stopping,
    safe_request_id,
)
from engine.ipc.wire import Inbound
from engine.layout import IPV4_BYTES, IPV6_BYTES, HostAddress, encode_msg_id, offset_to_file_name
from engine.logs import event
from engine.metrics.report import Figures, Histogram, per_queue
from engine.services.recovery import plan_commit_log_recovery
from engine.services.writer.deletion_records import DeletionRecords
from engine.services.writer.direct_sends import DirectSends
from engine.services.writer.log_appends import LogAppends
from engine.services.writer.retention_rounds import RetentionRounds
from engine.services.writer.sync_acks import OwnSync, PendingAck, SyncAcks
from engine.store.append_fence import AppendFence
from engine.store.commit_log import COMMIT_LOG_DIR, CommitLogWriter
from engine.store.disk_refusals import DiskRefusals
from engine.store.records import UniqKeys
from engine.store.shared_offsets import (
    CONFIRMED,
    EPOCH,
    FLUSHED,
    IN_SYNC_REPLICAS,
    LAST_STORE_TIMESTAMP,
    LEASE_DEADLINE,
    MIN_OFFSET,
    REPLICATED,
    WRITTEN,
)
from engine.store.unclean_stop import KILLED, POWER_LOSS, crash_start_kind

log = logging.getLogger(__name__)
_WAKE = encoder.encode(Wake())


# How the last stop left the log's tail (``engine/store/unclean_stop.py``), as the recovery log says it.
_START_KINDS = {"": "clean", KILLED: "after a kill (the tail past the end cleared)",
                POWER_LOSS: "after a possible power cut (the segment's tail swept)"}

class CommitLogWriterActor(Actor):
    """Takes ``Append`` and ``DeleteTopic`` on ``requests``, ``Wake`` and ``FlushFailed`` on ``flushes``;
    gives client replies (and ``TopicDeletion``s) on ``requests`` and ``Wake``s on ``announce``."""

    answers_directly = True  # its answers to clients skip the front when they can (``direct_replies``)
    drain_at_stop = (channels.WRITER,)

    tick_interval_ms = 100

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        cfg = env.config
        self.store_host = HostAddress.parse(cfg.store_host, cfg.store_port)
        self.msg_id_prefix = encode_msg_id(self.store_host, 0)[:-16]  # ip and port; the offset follows
        self.log = CommitLogWriter(env.store_dir, cfg.segment_size_bytes, store_host=self.store_host,
                                   with_record_crc=cfg.record_crc_enabled, warm_segments=cfg.warm_segments,
                                   background=env.background, reserve_step_bytes=cfg.segment_reserve_step_bytes)
        self.appends = LogAppends(self.log, env.store_dir, cfg, store_host=self.store_host,
                                  uniq_keys=UniqKeys(self.store_host, env.process_id))
        self.deletions = DeletionRecords(env.store_dir, env.slots)
        self.direct_sends = DirectSends(env.run_dir, env.slots, cfg)
        self.retention = RetentionRounds(self.log, env.store_dir, cfg, background=env.background)
        self.acks = SyncAcks()
        self.min_offset = 0
        self.flushed_offset = 0
        self.sync_flush = cfg.flush_mode == "SYNC_FLUSH"
        self.sync_replication = cfg.sync_replication  # sends wait for the in-sync replicas too
        # rmqpy_flush_seconds under SYNC_FLUSH: each wait for the writer's own sync (``OwnSync``)
        self.flush_seconds = Histogram.new()
        self.own_sync = OwnSync(env.syncer, env.waker.wake, env.name, self.segment_path, cfg.segment_size_bytes,
                                self.flush_seconds.observe, self.clock.mono_ms) if self.sync_flush else None
        self.preallocations = DiskRefusals("writer: preallocating the next segment", errnos=None,
                                            event_kind="segment.create_failed")
        self.busy_refusals = 0
        self.replica_refusals = 0
        self.disk_full_refusals = 0
        self.send_latency = Histogram.new()
        self.announce_due = False  # appended since the followers were last woken
        self.last_clean_ms = self.clock.mono_ms()
        self.fence = AppendFence(env.run_dir / REPLICA_APPEND_LOCK)

    def ports(self) -> list[Port]:
        ports = [Port(channels.WRITER, bind=True), Port(channels.CONFIRMED, bind=True)]
        if not self.sync_flush:  # the flusher flushes the log: a failed flush comes from it
            ports.append(Port(channels.FLUSHED, bind=False, subscribe=(endpoints.TOPIC_FLUSHED,)))
        if self.sync_replication:
            ports.append(Port(channels.REPLICATED, bind=False, subscribe=(endpoints.TOPIC_REPLICATED,)))
        return ports

    def segment_path(self, start: int) -> Path:
        return self.env.store_dir / COMMIT_LOG_DIR / offset_to_file_name(start)

    def handlers(self) -> dict[type, Handler]:
        return {Append: self.send, DeleteTopic: self.delete_topic, ReplicaAppend: self.replica_append,
                ReplicaDeletions: self.replica_deletions, Wake: self.on_flushed, FlushFailed: self.on_flush_failed,
                ClientFrame: self.direct_send}

    def takes_direct_requests(self) -> bool:
        return self.config.direct_sends_enabled

    def recover(self, out: Effects) -> None:
        unclean = crash_start_kind(self.env.run_dir / CRASH_START_FILE)
        plan = plan_commit_log_recovery(self.env.store_dir, self.config, unclean=bool(unclean))
        self.log.open_at(plan.end_offset, after_power_loss=unclean == POWER_LOSS)
        try:
            self.log.ensure_segment()  # before serving: the first send must not wait for a warm segment
        except OSError as exc:  # the engine starts DEGRADED, saying why; sends are refused until it clears
            self.appends.refused(exc, 0)
        self.deletions.clamp_to(plan.end_offset)
        self.appends.next_queue_offset = dict(plan.next_queue_offsets)
        self.appends.last_store_timestamp_ms = plan.last_store_timestamp_ms
        self.min_offset = plan.min_offset
        self.flushed_offset = plan.end_offset
        if self.own_sync is not None:  # readers never see past what is on disk, nor past a cut tail
            self.slots.set(FLUSHED, min(self.slots.get(FLUSHED), plan.end_offset))
            self.own_sync.recover(plan.scan_start, plan.end_offset)  # the scan began at the last durable point
            if self.own_sync.synced >= plan.end_offset:
                self.slots.set(FLUSHED, plan.end_offset)
        log.info("recovered: log end %d (scanned %d records, %d bytes from %d), %d queues, %d damaged ranges; "
                 "codec: %s; start: %s", plan.end_offset, plan.records_scanned, plan.bytes_scanned, plan.scan_start,
                 len(plan.next_queue_offsets), len(plan.damage), "compiled" if codec.COMPILED else "python",
                 _START_KINDS[unclean])
        self.clean_expired_segments(out)  # also decides at once whether the disk is too full for sends
        self.publish_offsets(out)

    @property
    def confirmed_offset(self) -> int:
        return self.log.written_offset

    def store_offsets(self) -> None:
        """The shared slots: what get_by_id and the owners' checks read, before any reply goes out."""
        offsets = self.slots
        offsets.set(LAST_STORE_TIMESTAMP, self.appends.last_store_timestamp_ms)
        offsets.set(WRITTEN, self.log.written_offset)
        offsets.set(CONFIRMED, self.confirmed_offset)
        offsets.set(MIN_OFFSET, self.min_offset)

    def publish_offsets(self, out: Effects) -> None:
        """Store the offsets, then wake the dispatcher and the flusher to read them."""
        self.store_offsets()
        self.announce_due = False
        out.publish(channels.CONFIRMED, endpoints.TOPIC_CONFIRMED, _WAKE)

    def drained(self, channel: Channel, out: Effects) -> None:
        """After the queued requests: one write of the deletion table, one wake-up for all of them
        (a PUB send wakes the dispatcher and the flusher, and one wake covers a run of batches)."""
        if channel is not channels.WRITER and channel is not self.direct_channel():
            return
        if self.deletions.unsaved:
            self.save_deletions(out)
        if self.own_sync is not None:  # readers wait for the sync: the wake-up comes with it (``on_thread_wake``)
            self.announce_due = False
            if self.own_sync.request(self.log.written_offset, in_loop_ms_max=self.config.writer_sync_in_loop_ms_max):
                self.on_thread_wake(out)  # synced here, in the loop: what the thread's wake-up would do
        elif self.announce_due:
            self.publish_offsets(out)

    def send(self, route: Append, inbound: Inbound, out: Effects) -> None:
        """Append the send (``LogAppends``); answered now, or once flushed (SYNC_FLUSH, ``SyncAcks``)."""
        reply_to, raw = inbound.origin, inbound.payload
        assert reply_to is not None
        try:
            waited_ms = self.clock.mono_ms() - route.received_ms
            if route.received_ms and waited_ms > self.config.send_queue_wait_ms_max:
                self.busy_refusals += 1
                raise RequestError(ErrorCode.BUSY, f"the send waited {waited_ms} ms for the writer (limit "
                                                   f"{self.config.send_queue_wait_ms_max} ms) and was not stored; "
                                                   f"retry later")
            if self.config.is_replica:  # the front refuses them first; an owner's dead letter would come here
                raise RequestError(ErrorCode.NOT_MASTER, f"this engine is a replica of {self.config.replica_of}: "
                                                         f"send to its master")
            if self.config.elected and self.clock.mono_ms() > self.slots.get(LEASE_DEADLINE):
                raise RequestError(ErrorCode.NOT_MASTER, "this engine's lease as master is not renewed (it may "
                                                         "no longer be master): nothing was stored; send to the "
                                                         "master etcd names")
            request = decode_as(SendRequest, raw)
            self.check_replicas(request)
            if self.deletions.unsaved:  # a deletion's queues start again at 0: it is saved before a later send
                self.save_deletions(out)
            assert len(route.born_ip) in (0, IPV4_BYTES, IPV6_BYTES), route.born_ip
            born_host = HostAddress(route.born_ip, 0) if route.born_ip else self.store_host
            stored, end_offset = self.appends.append(request, route.queue_id, now_ms=self.clock.wall_ms(),
                                                     internal=route.internal, born_host=born_host)
        except RequestError as exc:
            self.disk_full_refusals += exc.code == ErrorCode.DISK_FULL
            out.reply(reply_to, encode_error(safe_request_id(raw), exc.code, exc.message))
            return
        self.store_offsets()
        self.announce_due = True
        now_ms = self.clock.mono_ms()
        if request.wait_store and end_offset > self.acked_offset():
            deadline = now_ms + self.config.sync_flush_timeout_ms
            self.acks.wait(PendingAck(reply_to, request.id, end_offset, deadline, stored, route.received_ms))
            return
        if route.received_ms:
            self.send_latency.observe((now_ms - route.received_ms) / 1000)
        results = stored.results(self.msg_id_prefix, PutStatus.PUT_OK)
        out.reply(reply_to, encode_reply(request.id, results=results, epoch=self.slots.get(EPOCH)))

    def direct_send(self, _frame: ClientFrame, inbound: Inbound, out: Effects) -> None:
        """A send a client made straight to this port: checked and given its queue here
        (``DirectSends``), then appended as one the front routed; ROUTE_VIA_FRONT when only
        the front can decide (nothing stored)."""
        assert inbound.origin is not None
        now_ms = self.clock.mono_ms()
        try:
            queue_id = self.direct_sends.queue_of(decode_envelope(inbound.payload), now_ms)
        except RequestError as exc:
            out.reply(inbound.origin, encode_error(safe_request_id(inbound.payload), exc.code, exc.message))
            return
        self.send(Append(queue_id, now_ms, False, inbound.peer_ip), inbound, out)

    def replica_append(self, order: ReplicaAppend, inbound: Inbound, out: Effects) -> None:
        """A replica's append of its master's log bytes (``LogAppends.append_replicated``), answered
        with the log's end; the followers are woken as for sends (``drained``)."""
        assert inbound.origin is not None
        with self.fence.held():  # the supervisor may be looking at the log's end (``append_fence.py``)
            refused = self.of_another_epoch(order.epoch) or self.appends.append_replicated(
                order.offset, inbound.payload, deletions_crc=order.deletions_crc,
                own_deletions_crc=self.deletions.table.crc)
            if not refused:
                if not self.min_offset:  # an empty replica starts at its master's oldest segment
                    self.min_offset = self.log.segments.first_offset() or 0
                self.store_offsets()
                self.announce_due = True
        out.reply(inbound.origin, b"", ReplicaAppended(self.log.written_offset, refused))

    def of_another_epoch(self, epoch: int) -> str:
        """Why a replica's order of ``epoch`` is refused: a follow of an earlier epoch than the one
        the membership actor set ("" to go on; 0: no epochs, a replica not elected on etcd)."""
        current = self.slots.get(EPOCH)
        if epoch in (0, current):
            return ""
        return f"of a follow in epoch {epoch}; this engine is in epoch {current}"

    def check_replicas(self, request: SendRequest) -> None:
        """SYNC replication: refuse a send (nothing stored) while too few replicas are in sync."""
        if not (self.sync_replication and request.wait_store):
            return
        in_sync, needed = self.slots.get(IN_SYNC_REPLICAS), self.config.min_in_sync_replicas
        if in_sync < needed:
            self.replica_refusals += 1
            raise RequestError(ErrorCode.SLAVE_NOT_AVAILABLE,
                               f"{in_sync} replicas are in sync; min_in_sync_replicas is {needed} (nothing was "
                               f"stored; retry when they are back)")

    def durable_offset(self) -> int:
        """How far the log is as durable as the flush mode promises: flushed (SYNC_FLUSH) or written."""
        return self.flushed_offset if self.sync_flush else self.log.written_offset

    def replicated_offset(self) -> int | None:
        """What every in-sync replica holds (SYNC replication); None when sends do not wait for them."""
        return self.slots.get(REPLICATED) if self.sync_replication else None

    def acked_offset(self) -> int:
        """How far a waiting send may be answered PUT_OK: durable, and replicated under SYNC replication."""
        replicated = self.replicated_offset()
        return self.durable_offset() if replicated is None else min(self.durable_offset(), replicated)

    def refuse_at_stop(self, inbound: Inbound, out: Effects) -> None:
        """A send or a deletion still queued at a stop: SERVICE_NOT_AVAILABLE, with the note its
        requester waits for (the front forgets a deletion refused so); a replica's append is refused
        as one not for the log's end, and its receiver offers it again to the writer that starts next."""
        assert inbound.origin is not None
        body = inbound.body
        if isinstance(body, ReplicaAppend | ReplicaDeletions):
            out.reply(inbound.origin, b"", ReplicaAppended(self.log.written_offset, "the writer is stopping"))
        elif isinstance(body, DeleteTopic):
            topic = decode_as(DeleteTopicRequest, inbound.payload).topic  # the front decoded it before forwarding
            out.reply(inbound.origin, encode_stopping(inbound.payload), TopicDeletion(topic, recorded=False))
        else:  # a send, routed by the front or made straight to this port
            assert isinstance(body, Append | ClientFrame), type(body).__name__
            out.reply(inbound.origin, encode_stopping(inbound.payload))

    def answer_waiting_sends(self, out: Effects) -> None:
        """At a stop, after the last flush: every send still waiting gets the answer its deadline would
        have given it (stored either way): PUT_OK once durable and replicated, else FLUSH_SLAVE_TIMEOUT
        (or FLUSH_DISK_TIMEOUT)."""
        self.release_acks(out, self.clock.mono_ms())
        durable = self.durable_offset()
        for ack in self.acks.fail():
            status = PutStatus.FLUSH_SLAVE_TIMEOUT if ack.end_offset <= durable else PutStatus.FLUSH_DISK_TIMEOUT
            out.reply(ack.reply_to, encode_reply(ack.request_id, results=ack.stored.results(self.msg_id_prefix, status),
                                                 epoch=self.slots.get(EPOCH)))

    def replica_deletions(self, order: ReplicaDeletions, inbound: Inbound, out: Effects) -> None:
        """A replica's deletion table, its master's, before the records past a new deletion."""
        assert inbound.origin is not None
        if refused := self.of_another_epoch(order.epoch):
            out.reply(inbound.origin, b"", ReplicaAppended(self.log.written_offset, f"deletion table {refused}"))
            return
        try:
            self.deletions.adopt(inbound.payload, self.appends.forget_topic)
        except (ValueError, OSError) as exc:  # the next snapshot comes before any record past it
            log.error("cannot adopt the master's deletion table: %s", exc)
            out.reply(inbound.origin, b"", ReplicaAppended(self.log.written_offset, f"deletion table: {exc}"))
            return
        out.reply(inbound.origin, b"", ReplicaAppended(self.log.written_offset))

    def delete_topic(self, _order: DeleteTopic, inbound: Inbound, out: Effects) -> None:
        """Hide the topic's records below the written offset; answered by ``save_deletions``.

        Every send handled before this one lies below the deletion offset, every later one
        at or past it: the order of this actor's queue decides."""
        request = decode_as(DeleteTopicRequest, inbound.payload)  # the front decoded it before forwarding
        assert inbound.origin is not None
        self.deletions.record(inbound.origin, request.id, request.topic, self.log.written_offset)
        self.direct_sends.deleted(request.topic)

    def save_deletions(self, out: Effects) -> None:
        """Group commit of the deletion table (``DeletionRecords.save``), then every answer, each with a
        ``TopicDeletion`` frame: the front drops the topic only once its deletion is on disk here."""
        for reply_to, reply, note in self.deletions.save(self.appends.forget_topic):
            out.reply(reply_to, reply, note)

    def on_flushed(self, _wake: Wake, inbound: Inbound, out: Effects) -> None:
        """The flusher flushed (ASYNC_FLUSH), or the in-sync replicas hold more (SYNC replication: the
        dispatcher is woken too, as readers see only what they hold)."""
        self.release_acks(out, self.clock.mono_ms())
        if inbound.channel is channels.REPLICATED:
            self.publish_offsets(out)

    def on_thread_wake(self, out: Effects) -> None:
        """The flush thread synced the log (SYNC_FLUSH): the flushed offset for readers, the
        answers it covers, and the dispatcher woken to pass the new durable end on."""
        sync = self.own_sync
        assert sync is not None
        if sync.failure is not None:
            self.fail_stop(sync.failure, out)
            return
        if sync.synced > self.slots.get(FLUSHED):
            self.slots.set(FLUSHED, sync.synced)
            self.release_acks(out, self.clock.mono_ms())
            self.publish_offsets(out)

    def on_flush_failed(self, failure: FlushFailed, _inbound: Inbound, out: Effects) -> None:
        self.fail_stop(failure.reason, out)

    def fail_stop(self, reason: str, out: Effects) -> None:
        """A flush failed: never acknowledge past it; exit so recovery runs (fsyncgate)."""
        log.critical("the log could not be flushed past %d (%s); refusing acks and exiting",
                     self.flushed_offset, reason,
                     extra=event("flush.failed", reason=reason, flushed_offset=self.flushed_offset))
        for ack in self.acks.fail():
            out.reply(ack.reply_to, encode_error(ack.request_id, ErrorCode.FLUSH_FAILED,
                                                 f"the disk refused a flush: {reason}"))
        out.exit(70, f"the log could not be flushed: {reason}")  # the refusals go out first

    def release_acks(self, out: Effects, now_ms: int) -> None:
        """Answer the sends the flusher's slot now covers (or whose deadline passed)."""
        self.flushed_offset = max(self.flushed_offset, self.slots.get(FLUSHED))
        for ack, status in self.acks.release(self.durable_offset(), now_ms, self.replicated_offset()):
            if ack.received_ms:
                self.send_latency.observe((now_ms - ack.received_ms) / 1000)
            out.reply(ack.reply_to, encode_reply(ack.request_id, results=ack.stored.results(self.msg_id_prefix, status),
                                                 epoch=self.slots.get(EPOCH)))

    def clean_expired_segments(self, out: Effects) -> None:
        """A retention round (``RetentionRounds``); after deletions, the log's new min offset is published."""
        deleted = self.retention.round(self.clock.wall_ms() / 1000)
        self.appends.refuse_sends = self.retention.refuse_sends
        if deleted:
            self.min_offset = self.log.segments.first_offset() or self.log.written_offset
            self.publish_offsets(out)
            self.deletions.forget_below(self.min_offset)

    def tick(self, out: Effects) -> None:
        now_ms = self.clock.mono_ms()
        if now_ms - self.last_clean_ms >= self.config.clean_resource_interval_ms:
            self.last_clean_ms = now_ms
            self.clean_expired_segments(out)
        self.publish_offsets(out)
        if self.acks:  # a lost Wake on ``flushed`` holds no ack past this tick
            self.release_acks(out, now_ms)
        # As soon as a segment takes appends, the next one is prepared in the background
        # (RocketMQ's AllocateMappedFileService): zeroing a warm segment takes about as long
        # as 4 KiB batches take to fill half of one, and a roll must never wait for it.
        if self.appends.refusals.refusing:
            self.appends.retry_refused()
        try:
            self.log.ensure_next_segment()
        except OSError as exc:  # a roll creates it then, or refuses its append
            self.preallocations.refused(exc)
        else:
            if self.preallocations.refusing and self.log.next_segment_ready():
                self.preallocations.written()

    def detail(self) -> dict[str, int]:
        retention = self.retention
        return {"written_offset": self.log.written_offset, "confirmed_offset": self.confirmed_offset,
                "queues": len(self.appends.next_queue_offset), "pending_sync_acks": len(self.acks),
                "busy_refusals": self.busy_refusals, "retention_rounds": retention.rounds,
                "direct_sends": self.direct_sends.taken, "direct_sends_passed_on": self.direct_sends.passed_on,
                "forced_deleted_segments": retention.forced_deleted_segments,
                "forced_deleted_messages": retention.forced_deleted_messages}

    def condition(self) -> str:
        if self.appends.refusals.refusing:
            return self.appends.refusals.reason
        if self.retention.refuse_sends:
            return (f"sends refused: the disk is {self.retention.disk_used_ratio:.0%} used, past "
                    f"disk_space_warning_level_ratio ({self.config.disk_space_warning_level_ratio:.0%})")
        return ""

    def metrics(self) -> Figures:
        own_sync = {"rmqpy_flush_seconds": self.flush_seconds} if self.own_sync is not None else {}
        return {**own_sync, "rmqpy_queue_sent_messages": per_queue(self.appends.sent_messages),
                "rmqpy_queue_sent_bytes": per_queue(self.appends.sent_bytes),
                "rmqpy_send_latency_seconds": self.send_latency,
                "rmqpy_requests": [["send", self.direct_sends.taken]],  # beside the front's
                "rmqpy_refusals": [["BUSY", "writer", self.busy_refusals],
                                   ["DISK_FULL", "writer", self.disk_full_refusals],
                                   ["SLAVE_NOT_AVAILABLE", "writer", self.replica_refusals]],
                "rmqpy_disk_full": [[int(self.retention.refuse_sends)]]}

    def shutdown(self, out: Effects) -> None:
        self.retention.close()
        if self.own_sync is not None:
            self.own_sync.close()
        self.log.flush(max(0, self.log.written_offset - self.config.segment_size_bytes), self.log.written_offset)
        if self.own_sync is not None:
            self.slots.set(FLUSHED, self.log.written_offset)
        self.answer_waiting_sends(out)
        self.publish_offsets(out)
        self.log.close()
        self.fence.close()


if __name__ == "__main__":
    raise SystemExit(main(CommitLogWriterActor))
