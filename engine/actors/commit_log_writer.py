"""The CommitLog writer: the only process that appends to the log.

Receives sends forwarded by the front (ROUTER ``writer.sock``), validates
them, assigns queue offsets (one counter per topic-queue, rebuilt from the
log at start) and commit log offsets, appends the batch into the mapped
segment, then stores the new confirmed offset in the shared offsets, wakes
its followers (PUB ``writer-pub.sock``) and answers.

It also decides where a topic deletion falls in the log (``delete_topic``,
see ``engine/store/deleted_topics.py``): the front forwards the request here so
that every send routed before it lies below the deletion offset.

Under ASYNC_FLUSH a send is answered once its records are in the mapping.
Under SYNC_FLUSH the answer waits until the flusher reports the log flushed
past the batch (group commit: one flush covers every waiting batch), or
FLUSH_DISK_TIMEOUT after ``sync_flush_timeout_ms``.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import msgspec

from engine import codec
from engine.actors.base import Actor, Env, Handler, Port, main
from engine.actors.effects import Effects
from engine.codec import send_results
from engine.errors import ErrorCode, PutStatus, RequestError
from engine.ipc import channels, endpoints
from engine.ipc.channels import Channel
from engine.ipc.endpoints import CRASH_START_FILE
from engine.ipc.messages import Append, DeleteTopic, FlushFailed, TopicDeletion, Wake, encoder
from engine.ipc.protocol import (
    DeleteTopicRequest,
    SendRequest,
    decode_request,
    encode_error,
    encode_reply,
    safe_request_id,
)
from engine.ipc.wire import Inbound, Origin
from engine.layout import (
    END_FILE_MIN_BLANK_BYTES,
    IPV4_BYTES,
    IPV6_BYTES,
    SYSFLAG_TRANSACTION_COMMIT,
    HostAddress,
    encode_msg_id,
    offset_to_file_name,
)
from engine.logs import event
from engine.metrics.report import Figures, Histogram, per_queue
from engine.services.delivery_routes import destination
from engine.services.recovery import plan_commit_log_recovery
from engine.services.retention import SegmentFact, disk_space, disk_used_ratio, plan_deletions, summarize_segment
from engine.store.commit_log import CommitLogWriter
from engine.store.deleted_topics import DeletedTopics
from engine.store.disk_refusals import DiskRefusals
from engine.store.records import UniqKeys, build_items
from engine.store.shared_offsets import (
    CONFIRMED,
    FLUSHED,
    LAST_STORE_TIMESTAMP,
    MIN_OFFSET,
    TOPIC_DELETIONS,
    WRITTEN,
)

log = logging.getLogger(__name__)
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # refused with DISK_FULL; other errors of the disk with
# SERVICE_NOT_AVAILABLE (a read-only file system, EIO)
_WAKE = encoder.encode(Wake())


@dataclass
class Stored:
    """Where a batch went: enough to encode its results with either status."""

    offsets: list[int]
    queue_id: int
    first_queue_offset: int
    store_timestamp_ms: int

    def results(self, msg_id_prefix: str, status: PutStatus) -> msgspec.Raw:
        return msgspec.Raw(send_results(self.offsets, self.queue_id, self.first_queue_offset,
                                        self.store_timestamp_ms, msg_id_prefix, status.name, int(status)))


@dataclass
class PendingAck:
    """A batch waiting for the flusher (SYNC_FLUSH)."""

    reply_to: Origin
    request_id: int
    end_offset: int
    deadline_ms: int
    stored: Stored
    received_ms: int  # when the front took the send (0: not known), for the latency histogram


def _utc(timestamp_ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp_ms / 1000)) if timestamp_ms else "-"


@dataclass
class UnsavedDeletion:
    """A topic deletion recorded in memory, answered once the deletion table is on disk."""

    reply_to: Origin
    request_id: int
    topic: str
    deletion_offset: int
    previous_offset: int | None  # the topic's entry before, restored if the save fails


class CommitLogWriterActor(Actor):
    """Takes ``Append`` and ``DeleteTopic`` on ``requests``, ``Wake`` and ``FlushFailed`` on ``flushes``;
    gives client replies (and ``TopicDeletion``s) on ``requests`` and ``Wake``s on ``announce``."""

    tick_interval_ms = 100

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        cfg = env.config
        self.store_host = HostAddress.parse(cfg.store_host, cfg.store_port)
        self.msg_id_prefix = encode_msg_id(self.store_host, 0)[:-16]  # ip and port; the offset follows
        self.uniq_keys = UniqKeys(self.store_host, env.process_id)
        self.log = CommitLogWriter(env.store_dir, cfg.segment_size_bytes, store_host=self.store_host,
                                   with_record_crc=cfg.record_crc_enabled, warm_segments=cfg.warm_segments,
                                   background=env.background, reserve_step_bytes=cfg.segment_reserve_step_bytes)
        self.next_queue_offset: dict[tuple[str, int], int] = {}
        self.deleted_topics = DeletedTopics(env.store_dir)
        self.last_store_timestamp_ms = 0
        self.min_offset = 0
        self.flushed_offset = 0
        self.sync_flush = cfg.flush_mode == "SYNC_FLUSH"
        self.pending: deque[PendingAck] = deque()
        self.refuse_sends = False  # the disk is past disk_space_warning_level_ratio
        self.disk_used_ratio = 0.0  # at the last retention round
        # Appends the disk refuses (full, read-only, failing): logged once an episode, and the
        # engine is DEGRADED (``condition``) until a retry (``retry_refused_append``) takes them.
        self.appends = DiskRefusals("writer: appends", errnos=None, event_kind="segment.create_failed")
        self.refused_batch_bytes = 0  # the last refused append's size, which the retry reserves
        self.preallocations = DiskRefusals("writer: preallocating the next segment", errnos=None,
                                            event_kind="segment.create_failed")
        self.busy_refusals = 0
        self.disk_full_refusals = 0
        self.sent_messages: dict[tuple[str, int], int] = {}  # since this process started, for metrics
        self.sent_bytes: dict[tuple[str, int], int] = {}
        self.send_latency = Histogram.new()
        self.announce_due = False  # appended since the followers were last woken
        self.last_clean_ms = self.clock.mono_ms()
        self.unsaved_deletions: list[UnsavedDeletion] = []  # recorded in memory, answered after the save
        self.forced_counter: ThreadPoolExecutor | None = None  # counts what forced deletions took
        self.forced_deleted_segments = 0
        self.retention_rounds = 0
        self.forced_deleted_messages = 0

    def ports(self) -> list[Port]:
        return [Port(channels.WRITER, bind=True), Port(channels.CONFIRMED, bind=True),
                Port(channels.FLUSHED, bind=False, subscribe=(endpoints.TOPIC_FLUSHED,))]

    def handlers(self) -> dict[type, Handler]:
        return {Append: self.send, DeleteTopic: self.delete_topic, Wake: self.on_flushed,
                FlushFailed: self.fail_stop}

    def recover(self, out: Effects) -> None:
        unclean = (self.env.run_dir / CRASH_START_FILE).exists()
        plan = plan_commit_log_recovery(self.env.store_dir, self.config, unclean=unclean)
        self.log.open_at(plan.end_offset, after_power_loss=unclean)
        try:
            self.log.ensure_segment()  # before serving: the first send must not wait for a warm segment
        except OSError as exc:  # the engine starts DEGRADED, saying why; sends are refused until it clears
            self.append_refused(exc, 0)
        moved = self.deleted_topics.clamp_to(plan.end_offset)
        if moved:  # saved before the owners and the index builder read it
            log.warning("the log ends at %d, before the deletion of %s: their deletion offsets follow it down",
                        plan.end_offset, ", ".join(sorted(moved)))
            self.deleted_topics.save()
            self.announce_deletions()
        self.next_queue_offset = dict(plan.next_queue_offsets)
        self.last_store_timestamp_ms = plan.last_store_timestamp_ms
        self.min_offset = plan.min_offset
        self.flushed_offset = plan.end_offset
        log.info("recovered: log end %d (scanned %d records, %d bytes from %d), %d queues, %d damaged ranges; "
                 "codec: %s", plan.end_offset, plan.records_scanned, plan.bytes_scanned, plan.scan_start,
                 len(self.next_queue_offset), len(plan.damage), "compiled" if codec.COMPILED else "python")
        self.clean_expired_segments(out)  # also decides at once whether the disk is too full for sends
        self.publish_offsets(out)

    @property
    def confirmed_offset(self) -> int:
        return self.log.written_offset

    def store_offsets(self) -> None:
        """The shared slots: what get_by_id and the owners' checks read, before any reply goes out."""
        offsets = self.slots
        offsets.set(LAST_STORE_TIMESTAMP, self.last_store_timestamp_ms)
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
        if channel is not channels.WRITER:
            return
        if self.unsaved_deletions:
            self.save_deletions(out)
        if self.announce_due:
            self.publish_offsets(out)

    def send(self, route: Append, inbound: Inbound, out: Effects) -> None:
        reply_to, raw = inbound.origin, inbound.payload
        assert reply_to is not None
        try:
            waited_ms = self.clock.mono_ms() - route.received_ms
            if route.received_ms and waited_ms > self.config.send_queue_wait_ms_max:
                self.busy_refusals += 1
                raise RequestError(ErrorCode.BUSY, f"the send waited {waited_ms} ms for the writer (limit "
                                                   f"{self.config.send_queue_wait_ms_max} ms) and was not stored; "
                                                   f"retry later")
            request = decode_request("send", raw)
            assert isinstance(request, SendRequest)
            if self.unsaved_deletions:  # a deletion's queues start again at 0: it is saved before a later send
                self.save_deletions(out)
            assert len(route.born_ip) in (0, IPV4_BYTES, IPV6_BYTES), route.born_ip
            born_host = HostAddress(route.born_ip, 0) if route.born_ip else self.store_host
            stored, end_offset = self.append(request, route.queue_id, internal=route.internal, born_host=born_host)
        except RequestError as exc:
            self.disk_full_refusals += exc.code == ErrorCode.DISK_FULL
            out.reply(reply_to, encode_error(safe_request_id(raw), exc.code, exc.message))
            return
        self.store_offsets()
        self.announce_due = True
        now_ms = self.clock.mono_ms()
        if self.sync_flush and request.wait_store and end_offset > self.flushed_offset:
            deadline = now_ms + self.config.sync_flush_timeout_ms
            self.pending.append(PendingAck(reply_to, request.id, end_offset, deadline, stored, route.received_ms))
            return
        if route.received_ms:
            self.send_latency.observe((now_ms - route.received_ms) / 1000)
        results = stored.results(self.msg_id_prefix, PutStatus.PUT_OK)
        out.reply(reply_to, encode_reply(request.id, results=results))

    def append(self, request: SendRequest, queue_id: int, *, internal: bool = False,
               born_host: HostAddress | None = None) -> tuple[Stored, int]:
        """Validate and append a whole batch (all or nothing); RequestError if refused. ``born_host``:
        the sender's address (``Append.born_ip``), the store host when it has none."""
        if queue_id < 0:
            raise RequestError(ErrorCode.QUEUE_NOT_FOUND, "no queue was chosen for this send")
        if self.refuse_sends:
            raise RequestError(ErrorCode.DISK_FULL, f"the disk is more than "
                                                    f"{self.config.disk_space_warning_level_ratio:.0%} full; "
                                                    f"sends are refused until retention frees space")
        now_ms = self.clock.wall_ms()
        topic_name, queue_id, messages = destination(request, queue_id, config=self.config, now_ms=now_ms,
                                                     internal=internal)
        topic = topic_name.encode()
        batch = build_items(messages, config=self.config, uniq_keys=self.uniq_keys, now_ms=now_ms)
        items = batch.items
        if request.committed_half is not None:  # as EndTransactionProcessor stores a commit
            items = [(*item, SYSFLAG_TRANSACTION_COMMIT, request.committed_half) for item in items]
        born_host = born_host or self.store_host
        batch_bytes = self.log.items_size(topic, len(items), batch.payload_bytes, born_host=born_host)
        # One message may be as large as message_body_bytes_max; a batch of several is held
        # to send_batch_bytes_max as encoded, so one request never holds the log for long.
        if (len(batch.items) > 1 and batch_bytes > self.config.send_batch_bytes_max) \
                or batch_bytes + END_FILE_MIN_BLANK_BYTES > self.config.segment_size_bytes:
            raise RequestError(ErrorCode.MESSAGE_ILLEGAL, f"the batch takes {batch_bytes} bytes as records; the "
                                                          f"limit is {self.config.send_batch_bytes_max}")
        key = (topic_name, queue_id)
        first = self.next_queue_offset.get(key, 0)
        store_ts = max(now_ms, self.last_store_timestamp_ms)
        try:
            appended = self.log.append_items(topic, queue_id, items, born_host=born_host,
                                             batch_bytes=batch_bytes, first_queue_offset=first,
                                             store_timestamp_ms=store_ts)
        except OSError as exc:
            needed, free = self.append_refused(exc, batch_bytes)
            if exc.errno not in _FULL_ERRNOS:
                raise RequestError(ErrorCode.SERVICE_NOT_AVAILABLE,
                                   f"the log cannot be written: {exc.strerror or exc}; retry later") from None
            raise RequestError(ErrorCode.DISK_FULL, f"the disk has no room for this batch: it needs {needed} bytes "
                                                    f"(up to {self.config.segment_reserve_step_bytes} are reserved "
                                                    f"ahead at a time) and {free} bytes are free: {exc.strerror}"
                               ) from None
        self.appends.written()
        self.next_queue_offset[key] = first + len(items)
        self.sent_messages[key] = self.sent_messages.get(key, 0) + len(items)
        self.sent_bytes[key] = self.sent_bytes.get(key, 0) + batch_bytes
        self.last_store_timestamp_ms = store_ts
        return Stored(appended.offsets, queue_id, first, store_ts), appended.end_offset

    def append_refused(self, exc: OSError, batch_bytes: int) -> tuple[int, int]:
        """Note an append the disk refused (logged once an episode); (bytes needed, bytes free)."""
        free = disk_space(self.env.store_dir).free_bytes
        needed = batch_bytes + END_FILE_MIN_BLANK_BYTES
        self.refused_batch_bytes = batch_bytes
        if exc.errno in _FULL_ERRNOS:
            reason = f"cannot append: disk full (need {needed} bytes, {free} free)"
        else:
            reason = f"cannot append: {(exc.strerror or str(exc)).lower()}"
        self.appends.refused(exc, reason)
        return needed, free

    def retry_refused_append(self) -> None:
        """While appends are refused: does the disk take the last refused one now? (Its blocks are
        reserved, not written; no send waits for this.) The episode ends when it does."""
        try:
            self.log.reserve_for(self.refused_batch_bytes)
        except OSError as exc:
            free = disk_space(self.env.store_dir).free_bytes
            needed = self.refused_batch_bytes + END_FILE_MIN_BLANK_BYTES
            self.appends.reason = (f"cannot append: disk full (need {needed} bytes, {free} free)"
                                   if exc.errno in _FULL_ERRNOS
                                   else f"cannot append: {(exc.strerror or str(exc)).lower()}")
            return
        self.appends.written()

    def delete_topic(self, _order: DeleteTopic, inbound: Inbound, out: Effects) -> None:
        """Hide the topic's records below the written offset; answered by ``save_deletions``.

        Every send handled before this one lies below the deletion offset, every later one
        at or past it: the order of this actor's queue decides."""
        request = decode_request("delete_topic", inbound.payload)  # the front decoded it before forwarding
        assert isinstance(request, DeleteTopicRequest) and inbound.origin is not None
        deletion_offset = self.log.written_offset
        self.unsaved_deletions.append(UnsavedDeletion(inbound.origin, request.id, request.topic, deletion_offset,
                                                      self.deleted_topics.deletion_offsets.get(request.topic)))
        self.deleted_topics.record(request.topic, deletion_offset)

    def save_deletions(self, out: Effects) -> None:
        """Group commit of the deletion table: one write for the batch, then every answer.

        The reply carries a ``TopicDeletion`` frame: the front drops the topic from its table
        (and its consumer offsets) only once the deletion is on disk here."""
        batch, self.unsaved_deletions = self.unsaved_deletions, []
        try:
            self.deleted_topics.save()
        except OSError as exc:
            log.error("cannot record the deletion of %d topics: %s", len(batch), exc)
            for deletion in reversed(batch):  # back to what the file holds
                self.deleted_topics.undo(deletion.topic, deletion.previous_offset)
            for deletion in batch:
                reply = encode_error(deletion.request_id, ErrorCode.SERVICE_NOT_AVAILABLE,
                                     f"cannot record the deletion: {exc}")
                out.reply(deletion.reply_to, reply, TopicDeletion(deletion.topic, recorded=False))
            return
        for deletion in batch:
            queues = [key for key in self.next_queue_offset if key[0] == deletion.topic]
            for key in queues:
                del self.next_queue_offset[key]
            log.info("topic %r deleted at log offset %d (%d queues)", deletion.topic, deletion.deletion_offset,
                     len(queues))
        self.announce_deletions()
        for deletion in batch:
            reply = encode_reply(deletion.request_id, topic=deletion.topic, deletion_offset=deletion.deletion_offset)
            out.reply(deletion.reply_to, reply, TopicDeletion(deletion.topic, recorded=True))

    def announce_deletions(self) -> None:
        """Owners and the index builder reread ``config/deletedTopics.json`` when this count moves."""
        self.slots.set(TOPIC_DELETIONS, self.slots.get(TOPIC_DELETIONS) + 1)

    def on_flushed(self, _wake: Wake, _inbound: Inbound, out: Effects) -> None:
        self.flushed_offset = max(self.flushed_offset, self.slots.get(FLUSHED))
        self.release_pending(out, self.clock.mono_ms())

    def fail_stop(self, failure: FlushFailed, _inbound: Inbound, out: Effects) -> None:
        """A flush failed: never acknowledge past it; exit so recovery runs (fsyncgate)."""
        log.critical("the log could not be flushed past %d (%s); refusing acks and exiting",
                     self.flushed_offset, failure.reason,
                     extra=event("flush.failed", reason=failure.reason, flushed_offset=self.flushed_offset))
        for ack in self.pending:
            out.reply(ack.reply_to, encode_error(ack.request_id, ErrorCode.FLUSH_FAILED,
                                                 f"the disk refused a flush: {failure.reason}"))
        self.pending.clear()
        out.exit(70, f"the log could not be flushed: {failure.reason}")  # the refusals go out first

    def release_pending(self, out: Effects, now_ms: int) -> None:
        while self.pending and (self.pending[0].end_offset <= self.flushed_offset
                                or self.pending[0].deadline_ms <= now_ms):
            ack = self.pending.popleft()
            if ack.received_ms:
                self.send_latency.observe((now_ms - ack.received_ms) / 1000)
            status = PutStatus.PUT_OK if ack.end_offset <= self.flushed_offset else PutStatus.FLUSH_DISK_TIMEOUT
            results = ack.stored.results(self.msg_id_prefix, status)
            out.reply(ack.reply_to, encode_reply(ack.request_id, results=results))

    def clean_expired_segments(self, out: Effects) -> None:
        """Retention: delete expired segments (and, with disk_space_clean_forcibly, unexpired ones)."""
        self.retention_rounds += 1
        segments = self.log.segments
        segments.refresh()
        facts = []
        for start in segments.known:
            try:
                facts.append(SegmentFact(start, os.stat(segments.directory / offset_to_file_name(start)).st_mtime))
            except FileNotFoundError:
                continue
        active = self.log.written_offset - self.log.written_offset % self.config.segment_size_bytes
        decision = plan_deletions(self.config, facts, active_start=active, now_s=self.clock.wall_ms() / 1000,
                                  used_ratio=disk_used_ratio(self.env.store_dir))
        if decision.refuse_sends != self.refuse_sends:
            log.warning("disk %.0f %% used: sends are %s", decision.disk_used_ratio * 100,
                        "refused" if decision.refuse_sends else "accepted again",
                        extra=event("disk.full" if decision.refuse_sends else "disk.space_ok",
                                    disk_used_ratio=round(decision.disk_used_ratio, 4)))
        self.refuse_sends = decision.refuse_sends
        self.disk_used_ratio = decision.disk_used_ratio
        for start in decision.delete:
            if start in decision.forced:
                self.count_forced_deletion(start)
            segments.delete(start)
            log.info("retention: deleted segment %s", offset_to_file_name(start))
        if decision.delete:
            self.min_offset = segments.first_offset() or self.log.written_offset
            self.publish_offsets(out)
            try:
                if self.deleted_topics.forget_below(self.min_offset):
                    self.announce_deletions()
            except OSError as exc:  # harmless: the entries hide records that are gone; retried next time
                log.error("cannot rewrite the deleted-topic table: %s", exc)

    def count_forced_deletion(self, start: int) -> None:
        """An unexpired segment goes (``disk_space_clean_forcibly``): log and count what it held.

        The count runs in a background thread on a descriptor opened before the unlink."""
        name = offset_to_file_name(start)
        log.warning("retention: the disk is past disk_space_clean_forcibly_ratio: deleting the unexpired "
                    "segment %s; its messages are counted in the background", name)
        fd = os.open(self.log.segments.directory / name, os.O_RDONLY)
        if not self.env.background:
            self._count_forced(fd, start)
            return
        if self.forced_counter is None:
            self.forced_counter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forced-deletion")
        self.forced_counter.submit(self._count_forced, fd, start)

    def _count_forced(self, fd: int, start: int) -> None:
        try:
            summary = summarize_segment(fd, start)
        finally:
            os.close(fd)
        self.forced_deleted_segments += 1
        self.forced_deleted_messages += summary.messages
        log.warning("retention: deleted unexpired segment %s: %d messages%s, stored from %s to %s",
                    offset_to_file_name(start), summary.messages, "" if summary.complete else " (counted up to "
                    "a damaged record)", _utc(summary.first_store_timestamp_ms), _utc(summary.last_store_timestamp_ms),
                    extra=event("retention.forced_deletion", segment=offset_to_file_name(start),
                                messages=summary.messages))

    def tick(self, out: Effects) -> None:
        now_ms = self.clock.mono_ms()
        if now_ms - self.last_clean_ms >= self.config.clean_resource_interval_ms:
            self.last_clean_ms = now_ms
            self.clean_expired_segments(out)
        self.publish_offsets(out)
        if self.pending:
            self.release_pending(out, now_ms)
        # As soon as a segment takes appends, the next one is prepared in the background
        # (RocketMQ's AllocateMappedFileService): zeroing a warm segment takes about as long
        # as 4 KiB batches take to fill half of one, and a roll must never wait for it.
        if self.appends.refusing:
            self.retry_refused_append()
        try:
            self.log.ensure_next_segment()
        except OSError as exc:  # a roll creates it then, or refuses its append
            self.preallocations.refused(exc)
        else:
            if self.preallocations.refusing and self.log.next_segment_ready():
                self.preallocations.written()

    def detail(self) -> dict[str, int]:
        return {"written_offset": self.log.written_offset, "confirmed_offset": self.confirmed_offset,
                "queues": len(self.next_queue_offset), "pending_sync_acks": len(self.pending),
                "busy_refusals": self.busy_refusals, "retention_rounds": self.retention_rounds,
                "forced_deleted_segments": self.forced_deleted_segments,
                "forced_deleted_messages": self.forced_deleted_messages}

    def condition(self) -> str:
        if self.appends.refusing:
            return self.appends.reason
        if self.refuse_sends:
            return (f"sends refused: the disk is {self.disk_used_ratio:.0%} used, past "
                    f"disk_space_warning_level_ratio ({self.config.disk_space_warning_level_ratio:.0%})")
        return ""

    def metrics(self) -> Figures:
        return {"rmqpy_queue_sent_messages": per_queue(self.sent_messages),
                "rmqpy_queue_sent_bytes": per_queue(self.sent_bytes),
                "rmqpy_send_latency_seconds": self.send_latency,
                "rmqpy_refusals": [["BUSY", "writer", self.busy_refusals],
                                   ["DISK_FULL", "writer", self.disk_full_refusals]],
                "rmqpy_disk_full": [[int(self.refuse_sends)]]}

    def shutdown(self, out: Effects) -> None:
        if self.forced_counter is not None:
            self.forced_counter.shutdown(wait=True)
        self.log.flush(max(0, self.log.written_offset - self.config.segment_size_bytes), self.log.written_offset)
        self.publish_offsets(out)
        self.log.close()


if __name__ == "__main__":
    raise SystemExit(main(CommitLogWriterActor))
