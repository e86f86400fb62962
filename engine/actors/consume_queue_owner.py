"""A ConsumeQueue owner: serves the pulls and lookups of the queues it holds.

Owner k holds every (topic, queue_id) with ``owner_of(topic, queue_id) == k``;
``engine/services/owned_queues.py`` keeps their units equal to the log (dispatch
batches, catch-up, healing, deletions, retention). This module is the owner's
protocol:

* ``dispatches`` (SUB ``cq.<k>.``): ``DispatchBatch`` -> units written; the pulls
  parked on the queues it touched are woken;
* ``requests`` (ROUTER ``owner-<k>.sock``): ``Pull`` (at once, or parked until a
  matching message arrives: long polling), ``GetById``, ``GetByOffset``,
  ``QueueStats``, ``OffsetForTime`` -> the client reply, sent back through the front;
* ``requests`` also: ``Pop``, ``Ack``, ``ChangeInvisible``, ``PopStats``, served with the
  pop groups' ack state (``engine/actors/owner_pops.py``); a pop that finds nothing parks
  like a pull, on every queue it may take from;
* ``writer`` (DEALER to the writer): dead letters, sent as ``Append``s; the writer's replies;
* ticks: the queue files are flushed in the background, and the slot of the
  durable offset follows; expired long polls are answered; deliveries whose invisible
  time passed become due again.

Recovery (``OwnedQueues.restart``): the tail of every queue is checked against the
log (a kill can tear a unit), and the log is applied again from the restart point of
``engine/services/restart_points.py`` (units already present are skipped). Every
queue is then flushed, since a killed predecessor may have left units only in the
page cache.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from engine.actors.base import Actor, Env, Handler, Port, main
from engine.actors.effects import Effects
from engine.actors.owner_pops import OwnerPops
from engine.errors import ErrorCode, GetStatus, RequestError
from engine.ipc import channels, endpoints
from engine.ipc.channels import Channel
from engine.ipc.endpoints import CRASH_START_FILE
from engine.ipc.messages import (
    Ack,
    Answered,
    ChangeInvisible,
    DispatchBatch,
    GetById,
    GetByOffset,
    OffsetForTime,
    Pop,
    PopElsewhere,
    PopStats,
    Pull,
    QueueStats,
)
from engine.ipc.protocol import (
    GetByIdRequest,
    GetByOffsetRequest,
    OffsetForTimeRequest,
    PopRequest,
    PullRequest,
    QueueStatsRequest,
    decode_as,
    encode_error,
    encode_reply,
    safe_request_id,
)
from engine.ipc.wire import Inbound, Origin
from engine.layout import RecordError, decode_msg_id
from engine.metrics.report import Figures, per_queue
from engine.services.long_poll import LongPolls, ParkedPull
from engine.services.owned_queues import OwnedQueues, QueueKey
from engine.services.pull import PullResult, Subscription, pull
from engine.services.queue_queries import offset_for_time, queue_stats
from engine.store.checkpoint import CheckpointError, load_checkpoint
from engine.store.consume_queue import ConsumeQueue
from engine.store.shared_offsets import CONFIRMED, MIN_OFFSET, TOPIC_DELETIONS, owner_durable_slot, owner_slot

log = logging.getLogger(__name__)
_SUBSCRIPTIONS_CACHED_MAX = 1024
_NOTHING_YET = (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE)


class ConsumeQueueOwnerActor(Actor):
    """Takes ``DispatchBatch``es on ``dispatches``, and ``Pull``, ``QueueStats``, ``OffsetForTime``,
    ``GetById``, ``GetByOffset`` on ``requests``; gives client replies on ``requests``."""

    drain_at_stop = (channels.DISPATCH,)

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        cfg = env.config
        self.instance = env.instance
        self.owned = OwnedQueues(env.store_dir, cfg, env.instance)
        self.reader = self.owned.reader
        self.subscriptions: dict[str, Subscription] = {}
        self.syncer = env.syncer(env.name, self._publish_durable)  # flushes queue files off the loop
        self.last_flush_ms = self.clock.mono_ms()
        self.long_polls = LongPolls(parked_max=cfg.long_poll_parked_max, wait_ms_max=cfg.long_poll_wait_ms_max)
        self.woken: deque[ParkedPull] = deque()  # unparked, served long_poll_wakes_per_turn_max a turn
        self.sync_flush = cfg.flush_mode == "SYNC_FLUSH"
        self.pulled_messages: dict[QueueKey, int] = {}  # since this process started, for metrics
        self.pulled_bytes: dict[QueueKey, int] = {}
        self.pops = OwnerPops(self.owned, self.read_queue, self.subscription, config=cfg, clock=self.clock,
                              sync_flush=self.sync_flush)

    @property
    def visible_end(self) -> int:
        return self.slots.visible_end(sync_flush=self.sync_flush)

    def ports(self) -> list[Port]:
        return [Port(channels.owner(self.instance), bind=True),
                Port(channels.DISPATCH, bind=False, subscribe=(endpoints.owner_topic(self.instance),), hwm=100_000),
                Port(channels.WRITER, bind=False, immediate=True, reconnect_ivl_ms=10)]

    def handlers(self) -> dict[type, Handler]:
        serving = self.serving
        return {Pull: serving(self.on_pull), Pop: serving(self.on_pop), Ack: serving(self.on_ack),
                GetById: serving(lambda _o, inbound, _out: self.get_by_id(inbound.payload, by_offset=False)),
                GetByOffset: serving(lambda _o, inbound, _out: self.get_by_id(inbound.payload, by_offset=True)),
                QueueStats: serving(lambda _o, inbound, _out: self.queue_question(QueueStatsRequest, inbound.payload)),
                OffsetForTime: serving(lambda _o, inbound, _out: self.queue_question(OffsetForTimeRequest,
                                                                                    inbound.payload)),
                ChangeInvisible: serving(lambda _o, inbound, _out: self.pops.change_invisible(inbound.payload)),
                PopStats: serving(lambda _o, inbound, _out: self.pops.stats(inbound.payload)),
                Answered: self.on_writer_answer, DispatchBatch: self.on_batch}

    def recover(self, out: Effects) -> None:
        try:
            checkpoint = load_checkpoint(self.env.store_dir)
        except CheckpointError:
            checkpoint = None
        owned = self.owned
        owned.restart(deletions=self.slots.get(TOPIC_DELETIONS), confirmed=self.slots.get(CONFIRMED),
                      dispatched=checkpoint.dispatched_offset if checkpoint else 0,
                      unclean=(self.env.run_dir / CRASH_START_FILE).exists())
        self.catch_up()
        while owned.behind:  # before serving, all of it: recovery has its own start timeout
            self.catch_up()
        for path in owned.recent_files():  # a killed predecessor may have left units unflushed
            self.syncer.mark(path)
        self.flush_queues(wait=True)
        self.pops.recover()
        log.info("owner %d recovered %d queues, applied up to %d", self.instance, len(owned.queues),
                 owned.applied_offset)

    def catch_up(self) -> None:
        """Apply the log up to the readable end (one slice), wake what it touched, publish progress."""
        self.wake(self.owned.catch_up(self.visible_end))
        self.slots.set(owner_slot(self.instance), self.owned.applied_offset)

    def serving(self, serve: Callable[[Any, Inbound, Effects], bytes | None]) -> Handler:
        """A request's handler: ``serve`` gives the reply (None: it waits, parked, or went elsewhere);
        a RequestError is the client's error reply. Long polls that something woke are answered after."""

        def handler(order: object, inbound: Inbound, out: Effects) -> None:
            assert inbound.origin is not None
            self.follow_deletions()
            try:
                reply = serve(order, inbound, out)
            except RequestError as exc:
                reply = encode_error(safe_request_id(inbound.payload), exc.code, exc.message, **exc.details)
            if reply is not None:
                self.pops.reply(out, inbound.origin, reply)
            if self.woken:
                self.serve_woken(out, self.clock.mono_ms())
        return handler

    def on_batch(self, batch: DispatchBatch, _inbound: Inbound, out: Effects) -> None:
        self.follow_deletions()
        self.wake(self.owned.apply_batch(batch))
        self.slots.set(owner_slot(self.instance), self.owned.applied_offset)
        if self.woken:
            self.serve_woken(out, self.clock.mono_ms())

    def on_writer_answer(self, answer: Answered, inbound: Inbound, out: Effects) -> None:
        """The writer's answer to a dead letter's send."""
        self.pops.on_writer_reply(answer.client, inbound.payload)
        self.wake_unlocked()
        if self.woken:
            self.serve_woken(out, self.clock.mono_ms())

    def drained(self, channel: Channel, out: Effects) -> None:
        self.pops.release(out)

    def follow_deletions(self) -> None:
        for topic in self.owned.follow_deletions(self.slots.get(TOPIC_DELETIONS)):
            self.pops.indexes.drop_topic(topic, functools.partial(self.owned.is_mine, topic))

    def on_pull(self, _order: Pull, inbound: Inbound, _out: Effects) -> bytes | None:
        return self.pull(decode_as(PullRequest, inbound.payload), reply_to=inbound.origin)

    def on_pop(self, order: Pop, inbound: Inbound, out: Effects) -> bytes | None:
        request = decode_as(PopRequest, inbound.payload)
        if not order.then:
            return self.pop(request, order.queue_ids, reply_to=inbound.origin)
        # other owners hold queues of the topic: pass on rather than wait
        reply, empty = self.pops.pop(request, order.queue_ids)
        if empty:
            assert inbound.origin is not None
            out.reply(inbound.origin, inbound.payload, PopElsewhere(order.then))
            return None
        return reply

    def on_ack(self, _order: Ack, inbound: Inbound, out: Effects) -> bytes | None:
        reply = self.pops.ack(inbound.payload, out)
        self.wake_unlocked()
        return reply

    def subscription(self, expression: str) -> Subscription:
        cached = self.subscriptions.get(expression)
        if cached is None:
            if len(self.subscriptions) > _SUBSCRIPTIONS_CACHED_MAX:
                self.subscriptions.clear()
            cached = self.subscriptions[expression] = Subscription(expression)
        return cached

    def read_queue(self, cq: ConsumeQueue | None, offset: int, max_messages: int, max_bytes: int,
                   subscription: Subscription) -> PullResult:
        """What a pull from ``offset`` finds, after healing a unit that leads elsewhere."""
        visible_end, written_end = self.visible_end, self.slots.get(CONFIRMED)

        def pull_now() -> PullResult:
            return pull(cq, self.reader, offset=offset, visible_end=visible_end, subscription=subscription,
                        written_end=written_end, max_messages=max_messages, max_bytes=max_bytes)

        result = pull_now()
        if result.suspect_offset >= 0 and cq is not None and \
                self.owned.heal(cq, result.suspect_offset, visible_end=visible_end):
            result = pull_now()
        if result.suspect_offset >= 0 and not result.message_count:
            result.corrupt_offset = result.suspect_offset
            result.next_offset = result.suspect_offset + 1
        return result

    def pop(self, request: PopRequest, queue_ids: list[int], *, reply_to: Origin | None = None,
            final: bool = False, deadline_ms: int | None = None) -> bytes | None:
        """Serve a pop; None when it was parked to wait for a message (long polling)."""
        reply, empty = self.pops.pop(request, queue_ids)
        if empty and not final and request.max_wait_ms > 0 and reply_to is not None and \
                self.long_polls.park(reply_to, request, now_ms=self.clock.mono_ms(), deadline_ms=deadline_ms,
                                     queue_ids=queue_ids):
            return None
        return reply

    def pull(self, request: PullRequest, *, reply_to: Origin | None = None, final: bool = False,
             deadline_ms: int | None = None) -> bytes | None:
        """Serve a pull; None when it was parked to wait for a new message (long polling)."""
        cq = self.owned.get(request.topic, request.queue_id)
        max_messages = min(request.max_messages, self.config.pull_message_count_max)
        max_bytes = min(request.max_bytes, self.config.pull_bytes_max)
        result = self.read_queue(cq, request.offset, max_messages, max_bytes, self.subscription(request.subscription))
        if result.corrupt_offset >= 0:
            raise RequestError(ErrorCode.MESSAGE_CORRUPT,
                               f"the message at queue offset {result.corrupt_offset} is damaged (it failed its "
                               f"checks, or the log lost it) and is not served; the next offset is "
                               f"{result.next_offset}", next_offset=result.next_offset,
                               min_offset=result.min_offset, max_offset=result.max_offset)
        if result.message_count:
            key = (request.topic, request.queue_id)
            self.pulled_messages[key] = self.pulled_messages.get(key, 0) + result.message_count
            self.pulled_bytes[key] = self.pulled_bytes.get(key, 0) + sum(map(len, result.encoded))
        nothing_yet = result.status in _NOTHING_YET or (
            result.status == GetStatus.NO_MATCHED_MESSAGE and cq is not None and result.next_offset >= cq.max_offset)
        if not final and nothing_yet and request.max_wait_ms > 0 and reply_to is not None:
            waiting = msgspec.structs.replace(request, offset=max(request.offset, result.next_offset))
            if self.long_polls.park(reply_to, waiting, now_ms=self.clock.mono_ms(), deadline_ms=deadline_ms):
                return None  # answered when a (matching) message arrives, or at the deadline
        return encode_reply(request.id, status=result.status.name, status_code=int(result.status),
                            next_offset=result.next_offset, min_offset=result.min_offset,
                            max_offset=result.max_offset, messages=result.messages())

    def wake_unlocked(self) -> None:
        """Wake the pops parked on FIFO queues that an ack or a dead letter just unlocked."""
        if self.pops.unlocked:
            self.wake(self.pops.unlocked)
            self.pops.unlocked = set()

    def wake(self, queues: set[QueueKey], now_ms: int | None = None) -> None:
        """Unpark the pulls of ``queues`` that may now find a message, and every expired one;
        ``serve_woken`` answers them."""
        if self.long_polls and (queues or now_ms is not None):
            self.woken.extend(self.long_polls.ready(queues, self.clock.mono_ms() if now_ms is None else now_ms))

    def serve_woken(self, out: Effects, now_ms: int) -> None:
        """Answer up to ``long_poll_wakes_per_turn_max`` woken pulls; the rest in the next loop turns."""
        for _ in range(min(len(self.woken), self.config.long_poll_wakes_per_turn_max)):
            parked = self.woken.popleft()
            request, final = parked.request, parked.deadline_ms <= now_ms
            try:
                if isinstance(request, PopRequest):
                    reply = self.pop(request, parked.queue_ids, reply_to=parked.reply_to, final=final,
                                     deadline_ms=parked.deadline_ms)
                else:
                    reply = self.pull(request, reply_to=parked.reply_to, final=final, deadline_ms=parked.deadline_ms)
            except RequestError as exc:
                reply = encode_error(request.id, exc.code, exc.message, **exc.details)
            if reply is None:
                continue  # still nothing: parked again, with its original deadline
            self.pops.reply(out, parked.reply_to, reply)

    def queue_question(self, kind: type[QueueStatsRequest | OffsetForTimeRequest], raw: bytes) -> bytes:
        request = decode_as(kind, raw)
        cq = self.owned.get(request.topic, request.queue_id)
        if isinstance(request, QueueStatsRequest):
            stats = queue_stats(cq, self.reader, visible_end=self.visible_end)
            return encode_reply(request.id, **dataclasses.asdict(stats))
        offset = offset_for_time(cq, self.reader, timestamp_ms=request.timestamp, upper=request.boundary == "upper",
                                 visible_end=self.visible_end)
        return encode_reply(request.id, offset=offset)

    def get_by_id(self, raw: bytes, *, by_offset: bool = False) -> bytes:
        request: GetByOffsetRequest | GetByIdRequest
        if by_offset:
            request = decode_as(GetByOffsetRequest, raw)
            offset = request.commit_log_offset
        else:
            request = decode_as(GetByIdRequest, raw)
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
            code = ErrorCode.MESSAGE_CORRUPT if exc.damaged else ErrorCode.MESSAGE_NOT_FOUND
            raise RequestError(code, f"no intact message at commit log offset {offset}: {exc.reason}") from None
        if self.owned.deleted_topics.hides(view["topic"], offset):
            # a record of a deleted topic's earlier life: its queue offset names no message of the topic now
            return encode_reply(request.id, message=view, deleted_topic=True)
        return encode_reply(request.id, message=view)

    def flush_queues(self, *, wait: bool = False) -> None:
        """Make every unit below the applied offset durable, then say so (the checkpoint uses it).

        The files are flushed by a background thread: the owner keeps serving meanwhile."""
        for path in [*self.owned.unsynced_files(), *self.pops.journals_to_flush()]:
            self.syncer.mark(path)
        if wait:
            self.syncer.flush_now(self.owned.applied_offset)
        else:
            self.syncer.request(self.owned.applied_offset)

    def _publish_durable(self, offset: int) -> None:
        self.slots.set(owner_durable_slot(self.instance), offset)

    def tick(self, out: Effects) -> None:
        now_ms = self.clock.mono_ms()
        self.follow_deletions()
        self.owned.follow_retention(self.slots.get(MIN_OFFSET))
        if now_ms - self.last_flush_ms >= self.config.flush_consume_queue_interval_ms:
            self.last_flush_ms = now_ms
            self.flush_queues()
        if self.owned.stalled:
            self.catch_up()
        self.wake(self.pops.tick(out), now_ms)
        self.serve_woken(out, now_ms)
        self.pops.release(out)

    def backlog(self) -> bool:
        return bool(self.woken) or self.owned.behind

    def work_backlog(self, out: Effects) -> None:
        if self.owned.behind:
            self.catch_up()
        self.serve_woken(out, self.clock.mono_ms())
        self.pops.release(out)

    def detail(self) -> dict[str, int]:
        return {"applied_offset": self.owned.applied_offset, "queues": len(self.owned.queues),
                "parked_pulls": len(self.long_polls), "pop_queues": len(self.pops.indexes.queues)}

    def metrics(self) -> Figures:
        queues = self.owned.queues.values()
        return {"rmqpy_queue_pulled_messages": per_queue(self.pulled_messages),
                "rmqpy_queue_pulled_bytes": per_queue(self.pulled_bytes),
                "rmqpy_queue_min_offset": [[cq.topic, str(cq.queue_id), cq.min_offset] for cq in queues],
                "rmqpy_queue_max_offset": [[cq.topic, str(cq.queue_id), cq.max_offset] for cq in queues],
                **self.pops.metrics()}

    def shutdown(self, out: Effects) -> None:
        self.catch_up()
        while self.owned.behind:
            self.catch_up()
        far_future = self.clock.mono_ms() + 10 * self.config.long_poll_wait_ms_max
        self.wake(set(), far_future)  # answer every parked pull with what there is now
        while self.woken:
            self.serve_woken(out, far_future)
        self.pops.release(out)
        self.pops.close()
        self.flush_queues(wait=True)
        self.syncer.close()
        self.owned.close()


if __name__ == "__main__":
    raise SystemExit(main(ConsumeQueueOwnerActor))
