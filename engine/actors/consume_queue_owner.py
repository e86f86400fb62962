"""A ConsumeQueue owner: writes the units of its queues and serves their pulls.

Owner k holds every (topic, queue_id) with ``owner_of(topic, queue_id) == k``.
It applies ``DispatchBatch``es from the reput dispatcher (SUB ``cq.<k>.``)
and answers pulls and lookups by id forwarded by the front (ROUTER
``owner-<k>.sock``), reading message bytes through its own read-only mapping
of the CommitLog.

Progress: ``applied_offset``, the log offset below which every record of
its queues is in a unit. A batch starting above it means a batch was missed;
the owner reads the gap from the log itself before applying the batch.

Recovery: the last unit of every queue is checked against the record it
points at (a kill can tear a unit); then everything from the smallest, over
its queues, of ``max(checkpoint dispatched offset, end of the queue's last
unit)`` (or just the latter for a queue whose tail was dropped) up to the
confirmed offset is applied again from the log (units already present are
skipped: ``ConsumeQueue.put`` is idempotent). Every queue is then flushed,
since a killed predecessor may have left units only in the page cache.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque

import msgspec

from engine.actors.base import ROUTER, SUB, Actor, Env, Port, main
from engine.actors.effects import Effects
from engine.errors import ErrorCode, GetStatus, RequestError
from engine.ipc import endpoints
from engine.ipc.messages import (
    DispatchBatch,
    GetById,
    GetByOffset,
    OffsetForTime,
    Pull,
    QueueStats,
    dispatch_decoder,
    owner_request_decoder,
)
from engine.ipc.protocol import (
    GetByIdRequest,
    GetByOffsetRequest,
    OffsetForTimeRequest,
    PullRequest,
    QueueStatsRequest,
    decode_request,
    encode_error,
    encode_reply,
    safe_request_id,
)
from engine.services.long_poll import LongPolls, ParkedPull
from engine.services.pull import PullResult, Subscription, pull
from engine.services.queue_queries import offset_for_time, queue_stats
from engine.services.restart_points import QueueTail, owner_restart
from engine.store.checkpoint import CheckpointError, load_checkpoint
from engine.store.commit_log import CommitLogReader, Damage
from engine.store.consume_queue import ConsumeQueue, list_queues
from engine.store.deleted_topics import DeletedTopics
from engine.store.layout import RecordError, decode_msg_id, tags_code
from engine.store.mapped_file import list_files
from engine.store.records import owner_of
from engine.store.shared_offsets import CONFIRMED, MIN_OFFSET, TOPIC_DELETIONS, owner_durable_slot, owner_slot

log = logging.getLogger(__name__)
_HEAL_LOOKBACK_UNITS = 1000
_SUBSCRIPTIONS_CACHED_MAX = 1024
_NOTHING_YET = (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE)


class ConsumeQueueOwnerActor(Actor):
    """Takes ``DispatchBatch``es on ``dispatches``, and ``Pull``, ``QueueStats``, ``OffsetForTime``,
    ``GetById``, ``GetByOffset`` on ``requests``; gives client replies on ``requests``."""

    drain_at_stop = ("dispatches",)

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        cfg = env.config
        self.instance = env.instance
        self.owner_count = cfg.consume_queue_owner_count
        self.reader = CommitLogReader.for_config(env.store_dir, cfg)
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.applied_offset = 0
        self.stalled = False  # a unit could not be written (disk full); retried on every tick
        self.unhealable: set[tuple[str, int, int]] = set()
        self.subscriptions: dict[str, Subscription] = {}
        self.log_min_offset = 0
        self.syncer = env.syncer(env.name, self._publish_durable)  # flushes queue files off the loop
        self.last_flush_ms = self.clock.mono_ms()
        self.long_polls = LongPolls(parked_max=cfg.long_poll_parked_max, wait_ms_max=cfg.long_poll_wait_ms_max)
        self.woken: deque[ParkedPull] = deque()  # unparked, served long_poll_wakes_per_turn_max a turn
        self.behind = False  # catch-up stopped at its per-turn budget: the loop goes on with it
        self.sync_flush = cfg.flush_mode == "SYNC_FLUSH"
        self.deleted_topics = DeletedTopics(env.store_dir)

    def is_mine(self, topic: str, queue_id: int) -> bool:
        return owner_of(topic, queue_id, self.owner_count) == self.instance

    def queue(self, topic: str, queue_id: int, *, create: bool) -> ConsumeQueue | None:
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None and create:
            cq = ConsumeQueue(self.env.store_dir, topic, queue_id,
                              file_units=self.config.consume_queue_file_units, writable=True)
            self.queues[key] = cq
        return cq

    @property
    def visible_end(self) -> int:
        return self.slots.visible_end(sync_flush=self.sync_flush)

    def ports(self) -> list[Port]:
        return [Port("requests", ROUTER, endpoints.owner_endpoint_name(self.instance), bind=True),
                Port("dispatches", SUB, endpoints.REPUT_PUB, bind=False,
                     subscribe=(endpoints.owner_topic(self.instance),), hwm=100_000)]

    def recover(self, out: Effects) -> None:
        self.deleted_topics.follow(self.slots.get(TOPIC_DELETIONS))
        for topic, queue_id in list_queues(self.env.store_dir):
            if self.is_mine(topic, queue_id):
                cq = self.queue(topic, queue_id, create=True)
                assert cq is not None
                if self.deleted_topics.is_leftover(cq):  # the topic was deleted before we removed it
                    self.drop_queue(cq)
        confirmed = self.slots.get(CONFIRMED)
        self.log_min_offset = self.reader.min_offset()
        for cq in self.queues.values():  # retention may have removed segments since the queue was written
            cq.drop_before(self.log_min_offset)
        try:
            checkpoint = load_checkpoint(self.env.store_dir)
        except CheckpointError:
            checkpoint = None
        tails = []
        for cq in self.queues.values():
            dropped = self.repair_tail(cq, confirmed)
            tails.append(QueueTail(cq.max_physical_end, dropped))
        self.applied_offset = owner_restart(tails, dispatched=checkpoint.dispatched_offset if checkpoint else 0,
                                            log_min=self.reader.min_offset(), confirmed=confirmed)
        self.catch_up(self.visible_end)
        while self.behind:  # before serving, all of it: recovery has its own start timeout
            self.catch_up(self.visible_end)
        self.slots.set(owner_slot(self.instance), self.applied_offset)
        for cq in self.queues.values():  # a killed predecessor may have left units unflushed
            for _start, path in list_files(cq.files.directory)[-2:]:
                self.syncer.mark(path)
        self.flush_queues(wait=True)
        log.info("owner %d recovered %d queues, applied up to %d", self.instance, len(self.queues),
                 self.applied_offset)

    def drop_queue(self, cq: ConsumeQueue) -> None:
        del self.queues[(cq.topic, cq.queue_id)]
        cq.destroy()
        log.info("queue %s/%d removed: its topic was deleted", cq.topic, cq.queue_id)

    def follow_deletions(self) -> None:
        """The writer recorded a topic deletion: drop that topic's queues before applying anything more.

        Every unit they hold points below the deletion offset: units at or past it are dispatched
        only after the writer bumped ``TOPIC_DELETIONS``, and this runs before each dispatch."""
        changed = self.deleted_topics.follow(self.slots.get(TOPIC_DELETIONS))
        for cq in [cq for (topic, _queue_id), cq in self.queues.items() if topic in changed]:
            self.drop_queue(cq)

    def repair_tail(self, cq: ConsumeQueue, confirmed: int) -> bool:
        """Drop trailing units that do not point at their own record below ``confirmed``; True if any."""
        dropped = False
        for _ in range(cq.max_offset - cq.min_offset):
            queue_offset = cq.max_offset - 1
            unit = cq.get(queue_offset)
            if unit is None or unit.is_blank:
                return dropped
            try:
                record = self.reader.read(unit.commit_log_offset, limit=confirmed, check_crc=False)
                if (record.topic, record.queue_id, record.queue_offset, record.total_size) == \
                        (cq.topic, cq.queue_id, queue_offset, unit.size):
                    return dropped
            except RecordError:
                pass
            log.warning("queue %s/%d: unit %d does not match the log; dropped", cq.topic, cq.queue_id, queue_offset)
            cq.truncate_from(queue_offset)
            dropped = True
        return dropped

    def catch_up(self, end: int) -> None:
        """Apply every record of our queues in [applied_offset, end) straight from the log.

        At most ``catch_up_bytes_per_turn_max`` of log a call: past it, ``behind`` is set
        and the loop calls again (``work_backlog``) until ``end``."""
        start = self.applied_offset
        self.behind = False
        if end <= start:
            return
        touched: set[tuple[str, int]] = set()
        for item in self.reader.scan(start, end, check_crc=False):
            if isinstance(item, Damage):
                reached = item.end
            else:
                if self.is_mine(item.topic, item.queue_id):
                    if not self.apply(item.topic, item.queue_id, item.queue_offset, item.commit_log_offset,
                                      item.total_size, tags_code(item.tags)):
                        break
                    touched.add((item.topic, item.queue_id))
                reached = item.commit_log_offset + item.total_size
            if reached - start >= self.config.catch_up_bytes_per_turn_max and reached < end:
                self.applied_offset, self.behind = reached, True
                break
        else:
            self.applied_offset = end
        if touched and self.long_polls:
            self.wake(touched, self.clock.mono_ms())  # answered at the end of this handler call

    def apply(self, topic: str, queue_id: int, queue_offset: int, commit_log_offset: int, size: int,
              code: int) -> bool:
        """Write one unit; on a full disk stop at this record (False) and retry from it later."""
        if self.deleted_topics and self.deleted_topics.hides(topic, commit_log_offset):
            return True
        try:
            cq = self.queue(topic, queue_id, create=True)
            assert cq is not None
            cq.put(queue_offset, commit_log_offset, size, code)
        except OSError as exc:
            if not self.stalled:
                log.error("cannot extend queue %s/%d: %s; retrying from offset %d", topic, queue_id, exc,
                          commit_log_offset)
            self.stalled = True
            self.applied_offset = commit_log_offset
            return False
        self.stalled = False
        return True

    def subscription(self, expression: str) -> Subscription:
        cached = self.subscriptions.get(expression)
        if cached is None:
            if len(self.subscriptions) > _SUBSCRIPTIONS_CACHED_MAX:
                self.subscriptions.clear()
            cached = self.subscriptions[expression] = Subscription(expression)
        return cached

    def heal(self, cq: ConsumeQueue, queue_offset: int) -> bool:
        """Rebuild units from ``queue_offset`` on from the log; True if any unit changed.

        Starts after the nearest earlier unit that still leads to its own record
        (or at the start of the log), and rewrites every unit of this queue
        that differs from what the log says.
        """
        start = self.reader.min_offset()
        for earlier in range(queue_offset - 1, max(cq.min_offset, queue_offset - _HEAL_LOOKBACK_UNITS) - 1, -1):
            unit = cq.get(earlier)
            if unit is not None and unit.is_plausible and self._unit_matches(cq, earlier, unit):
                start = unit.commit_log_offset + unit.size
                break
        changed = 0
        for item in self.reader.scan(start, self.applied_offset, check_crc=False):
            if isinstance(item, Damage) or (item.topic, item.queue_id) != (cq.topic, cq.queue_id) \
                    or self.deleted_topics.hides(item.topic, item.commit_log_offset):
                continue
            if queue_offset <= item.queue_offset < cq.max_offset:
                rebuilt = (item.commit_log_offset, item.total_size, tags_code(item.tags))
                if tuple(cq.get(item.queue_offset) or ()) != rebuilt:
                    cq.overwrite(item.queue_offset, *rebuilt)
                    changed += 1
        log.error("queue %s/%d: damaged unit at %d; rebuilt %d units from the log from offset %d", cq.topic,
                  cq.queue_id, queue_offset, changed, start)
        return changed > 0

    def _unit_matches(self, cq: ConsumeQueue, queue_offset: int, unit) -> bool:
        try:
            record = self.reader.read(unit.commit_log_offset, limit=self.visible_end, check_crc=False)
        except RecordError:
            return False
        return (record.topic, record.queue_id, record.queue_offset, record.total_size) == \
            (cq.topic, cq.queue_id, queue_offset, unit.size)

    def handle(self, port: str, frames: list[bytes], out: Effects) -> None:
        if port == "requests":
            self.handle_request(frames, out)
        else:
            self.handle_dispatch(frames)
        if self.woken:
            self.serve_woken(out, self.clock.mono_ms())

    def handle_dispatch(self, frames: list[bytes]) -> None:
        batch: DispatchBatch = dispatch_decoder.decode(frames[1])
        self.follow_deletions()
        if batch.end <= self.applied_offset:
            return
        if batch.start > self.applied_offset:
            if self.behind:
                return  # the backlog's catch-up reads this batch's records from the log
            log.info("owner %d missed [%d, %d); reading it from the log", self.instance, self.applied_offset,
                     batch.start)
            self.catch_up(batch.start)
        if self.stalled or self.behind:
            return  # the tick (or the next turn) goes on from the record it reached
        touched: set[tuple[str, int]] = set()
        for entry in batch.entries:
            if entry.commit_log_offset < self.applied_offset:
                continue
            if not self.apply(entry.topic, entry.queue_id, entry.queue_offset, entry.commit_log_offset,
                              entry.size, entry.tags_code):
                return
            touched.add((entry.topic, entry.queue_id))
        self.applied_offset = batch.end
        self.slots.set(owner_slot(self.instance), self.applied_offset)
        if touched and self.long_polls:
            self.wake(touched, self.clock.mono_ms())

    def handle_request(self, frames: list[bytes], out: Effects) -> None:
        """[front id, client id, REQ flag, envelope, client request]: routed by the envelope's type."""
        reply_to, raw = frames[:3], frames[4]
        self.follow_deletions()
        reply: bytes | None
        try:
            match owner_request_decoder.decode(frames[3]):
                case Pull():
                    request = decode_request("pull", raw)
                    assert isinstance(request, PullRequest)
                    reply = self.pull(request, reply_to=reply_to)
                case GetById():
                    reply = self.get_by_id(raw, by_offset=False)
                case GetByOffset():
                    reply = self.get_by_id(raw, by_offset=True)
                case QueueStats():
                    reply = self.queue_question("queue_stats", raw)
                case OffsetForTime():
                    reply = self.queue_question("offset_for_time", raw)
        except RequestError as exc:
            reply = encode_error(safe_request_id(raw), exc.code, exc.message, **exc.details)
        if reply is not None:
            out.send("requests", [*reply_to, reply])

    def pull(self, request: PullRequest, *, reply_to: list[bytes] | None = None, final: bool = False,
             deadline_ms: int | None = None) -> bytes | None:
        """Serve a pull; None when it was parked to wait for a new message (long polling)."""
        cq = self.queue(request.topic, request.queue_id, create=False)
        subscription = self.subscription(request.subscription)
        visible_end, written_end = self.visible_end, self.slots.get(CONFIRMED)
        max_messages = min(request.max_messages, self.config.pull_message_count_max)
        max_bytes = min(request.max_bytes, self.config.pull_bytes_max)

        def pull_now() -> PullResult:
            return pull(cq, self.reader, offset=request.offset, visible_end=visible_end, subscription=subscription,
                        written_end=written_end, max_messages=max_messages, max_bytes=max_bytes)

        result = pull_now()
        suspect = (request.topic, request.queue_id, result.suspect_offset)
        if result.suspect_offset >= 0 and cq is not None and suspect not in self.unhealable:
            if self.heal(cq, result.suspect_offset):
                result = pull_now()
            else:
                self.unhealable.add(suspect)  # a damaged record, not a unit: do not rescan on every pull
        if result.suspect_offset >= 0 and not result.message_count:
            result.corrupt_offset = result.suspect_offset
            result.next_offset = result.suspect_offset + 1
        if result.corrupt_offset >= 0:
            raise RequestError(ErrorCode.MESSAGE_CORRUPT,
                               f"the message at queue offset {result.corrupt_offset} is damaged (it failed its "
                               f"checks, or the log lost it) and is not served; the next offset is "
                               f"{result.next_offset}", next_offset=result.next_offset,
                               min_offset=result.min_offset, max_offset=result.max_offset)
        nothing_yet = result.status in _NOTHING_YET or (
            result.status == GetStatus.NO_MATCHED_MESSAGE and cq is not None and result.next_offset >= cq.max_offset)
        if not final and nothing_yet and request.max_wait_ms > 0 and reply_to is not None:
            waiting = msgspec.structs.replace(request, offset=max(request.offset, result.next_offset))
            if self.long_polls.park(reply_to, waiting, now_ms=self.clock.mono_ms(), deadline_ms=deadline_ms):
                return None  # answered when a (matching) message arrives, or at the deadline
        return encode_reply(request.id, status=result.status.name, status_code=int(result.status),
                            next_offset=result.next_offset, min_offset=result.min_offset,
                            max_offset=result.max_offset, messages=result.messages())

    def wake(self, queues: set[tuple[str, int]], now_ms: int) -> None:
        """Unpark the pulls of ``queues`` that may now find a message, and every expired one;
        ``serve_woken`` answers them."""
        self.woken.extend(self.long_polls.ready(queues, now_ms))

    def serve_woken(self, out: Effects, now_ms: int) -> None:
        """Answer up to ``long_poll_wakes_per_turn_max`` woken pulls; the rest in the next loop turns."""
        for _ in range(min(len(self.woken), self.config.long_poll_wakes_per_turn_max)):
            parked = self.woken.popleft()
            try:
                reply = self.pull(parked.request, reply_to=parked.reply_to, final=parked.deadline_ms <= now_ms,
                                  deadline_ms=parked.deadline_ms)
            except RequestError as exc:
                reply = encode_error(parked.request.id, exc.code, exc.message, **exc.details)
            if reply is None:
                continue  # still nothing: parked again, with its original deadline
            out.send("requests", [*parked.reply_to, reply])

    def queue_question(self, op: str, raw: bytes) -> bytes:
        request = decode_request(op, raw)
        assert isinstance(request, QueueStatsRequest | OffsetForTimeRequest)
        cq = self.queue(request.topic, request.queue_id, create=False)
        if isinstance(request, QueueStatsRequest):
            stats = queue_stats(cq, self.reader, visible_end=self.visible_end)
            return encode_reply(request.id, **dataclasses.asdict(stats))
        offset = offset_for_time(cq, self.reader, timestamp_ms=request.timestamp, upper=request.boundary == "upper",
                                 visible_end=self.visible_end)
        return encode_reply(request.id, offset=offset)

    def get_by_id(self, raw: bytes, *, by_offset: bool = False) -> bytes:
        if by_offset:
            request = decode_request("get_by_offset", raw)
            assert isinstance(request, GetByOffsetRequest)
            offset = request.commit_log_offset
        else:
            request = decode_request("get_by_id", raw)
            assert isinstance(request, GetByIdRequest)
            try:
                _host, offset = decode_msg_id(request.msg_id)
            except ValueError as exc:
                raise RequestError(ErrorCode.INVALID_MSG_ID,
                                   f"{request.msg_id!r} is not a message id: {exc}") from None
        end = self.visible_end
        if not self.reader.min_offset() <= offset < end:
            raise RequestError(ErrorCode.MESSAGE_NOT_FOUND, f"no message at commit log offset {offset}")
        try:
            view = self.reader.read_view(offset, limit=end)
        except RecordError as exc:
            code = ErrorCode.MESSAGE_CORRUPT if "CRC" in exc.reason else ErrorCode.MESSAGE_NOT_FOUND
            raise RequestError(code, f"no intact message at commit log offset {offset}: {exc.reason}") from None
        return encode_reply(request.id, message=view)

    def flush_queues(self, *, wait: bool = False) -> None:
        """Make every unit below the applied offset durable, then say so (the checkpoint uses it).

        The files are flushed by a background thread: the owner keeps serving meanwhile."""
        for cq in self.queues.values():
            for path in cq.take_unsynced():
                self.syncer.mark(path)
        if wait:
            self.syncer.flush_now(self.applied_offset)
        else:
            self.syncer.request(self.applied_offset)

    def _publish_durable(self, offset: int) -> None:
        self.slots.set(owner_durable_slot(self.instance), offset)

    def apply_retention(self) -> None:
        """The writer deleted old segments: forget their mappings, drop units that point only there."""
        log_min = self.slots.get(MIN_OFFSET)
        if log_min <= self.log_min_offset:
            return
        self.log_min_offset = log_min
        self.reader.segments.refresh()
        deleted = sum(cq.drop_before(log_min) for cq in self.queues.values())
        log.info("retention: log starts at %d; %d queue files deleted", log_min, deleted)

    def tick(self, out: Effects) -> None:
        now_ms = self.clock.mono_ms()
        self.follow_deletions()
        self.apply_retention()
        if now_ms - self.last_flush_ms >= self.config.flush_consume_queue_interval_ms:
            self.last_flush_ms = now_ms
            self.flush_queues()
        if self.stalled:
            self.catch_up(self.visible_end)
        if self.long_polls:
            self.wake(set(), now_ms)
        self.serve_woken(out, now_ms)

    def backlog(self) -> bool:
        return bool(self.woken) or self.behind

    def work_backlog(self, out: Effects) -> None:
        if self.behind:
            self.catch_up(self.visible_end)
            self.slots.set(owner_slot(self.instance), self.applied_offset)
        self.serve_woken(out, self.clock.mono_ms())
        self.slots.set(owner_slot(self.instance), self.applied_offset)

    def detail(self) -> dict[str, int]:
        return {"applied_offset": self.applied_offset, "queues": len(self.queues),
                "parked_pulls": len(self.long_polls)}

    def shutdown(self, out: Effects) -> None:
        self.catch_up(self.visible_end)
        while self.behind:
            self.catch_up(self.visible_end)
        far_future = self.clock.mono_ms() + 10 * self.config.long_poll_wait_ms_max
        self.wake(set(), far_future)  # answer every parked pull with what there is now
        while self.woken:
            self.serve_woken(out, far_future)
        self.slots.set(owner_slot(self.instance), self.applied_offset)
        self.flush_queues(wait=True)
        self.syncer.close()
        for cq in self.queues.values():
            cq.close()


if __name__ == "__main__":
    raise SystemExit(main(ConsumeQueueOwnerActor))
