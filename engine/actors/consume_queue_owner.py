"""A ConsumeQueue owner: serves the pulls and lookups of the queues it holds.

Owner k holds every (topic, queue_id) with ``owner_of(topic, queue_id) == k``;
``engine/services/owner/owned_queues.py`` keeps their units equal to the log (dispatch
batches, catch-up, healing, deletions, retention). This module is the owner's
protocol:

* ``dispatches`` (SUB ``cq.<k>.``): ``DispatchBatch`` -> units written; the pulls
  parked on the queues it touched are woken;
* ``requests`` (ROUTER ``owner-<k>.sock``): ``Pull`` (at once, or parked until a
  matching message arrives: long polling), ``GetById``, ``GetByOffset``,
  ``QueueStats``, ``OffsetForTime`` -> the client reply, sent back through the front
  (the reads themselves: ``engine/services/owner/queue_reads.py``);
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

import functools
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from engine.actors.base import Actor, Env, Handler, Port, main
from engine.actors.effects import Effects
from engine.actors.owner_pops import OwnerPops
from engine.errors import RequestError
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
    AckRequest,
    ChangeInvisibleRequest,
    OffsetForTimeRequest,
    PopRequest,
    PopStatsRequest,
    PullRequest,
    QueueStatsRequest,
    decode_as,
    encode_error,
    safe_request_id,
)
from engine.ipc.wire import Inbound, Origin
from engine.metrics.report import Figures, per_queue
from engine.services.owner.long_poll import LongPolls, ParkedPull
from engine.services.owner.owned_queues import OwnedQueues, QueueKey
from engine.services.owner.queue_reads import QueueReads
from engine.store.checkpoint import CheckpointError, load_checkpoint
from engine.store.shared_offsets import CONFIRMED, MIN_OFFSET, TOPIC_DELETIONS, owner_durable_slot, owner_slot

log = logging.getLogger(__name__)


class ConsumeQueueOwnerActor(Actor):
    """Takes ``DispatchBatch``es on ``dispatches``, and ``Pull``, ``QueueStats``, ``OffsetForTime``,
    ``GetById``, ``GetByOffset`` on ``requests``; gives client replies on ``requests``."""

    answers_directly = True  # its answers to clients skip the front when they can (``direct_replies``)

    drain_at_stop = (channels.DISPATCH,)

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        cfg = env.config
        self.instance = env.instance
        self.owned = OwnedQueues(env.store_dir, cfg, env.instance)
        self.syncer = env.syncer(env.name, self._publish_durable)  # flushes queue files off the loop
        self.last_flush_ms = self.clock.mono_ms()
        self.long_polls = LongPolls(parked_max=cfg.long_poll_parked_max, wait_ms_max=cfg.long_poll_wait_ms_max)
        self.woken: deque[ParkedPull] = deque()  # unparked, served long_poll_wakes_per_turn_max a turn
        self.sync_flush = cfg.flush_mode == "SYNC_FLUSH"
        self.reads = QueueReads(self.owned, env.slots, cfg, self.long_polls, mono_ms=self.clock.mono_ms,
                                sync_flush=self.sync_flush)
        self.pops = OwnerPops(self.owned, self.reads.read_queue, self.reads.subscription, config=cfg,
                              clock=self.clock, sync_flush=self.sync_flush)

    def ports(self) -> list[Port]:
        return [Port(channels.owner(self.instance), bind=True),
                Port(channels.DISPATCH, bind=False, subscribe=(endpoints.owner_topic(self.instance),), hwm=100_000),
                Port(channels.WRITER, bind=False, immediate=True, reconnect_ivl_ms=10, await_peer=True)]

    def handlers(self) -> dict[type, Handler]:
        serving = self.serving
        return {Pull: serving(self.on_pull), Pop: serving(self.on_pop), Ack: serving(self.on_ack),
                GetById: serving(lambda _o, inbound, _out: self.reads.get_by_id(inbound.payload, by_offset=False)),
                GetByOffset: serving(lambda _o, inbound, _out: self.reads.get_by_id(inbound.payload, by_offset=True)),
                QueueStats: serving(lambda _o, inbound, _out: self.reads.queue_question(QueueStatsRequest,
                                                                                       inbound.payload)),
                OffsetForTime: serving(lambda _o, inbound, _out: self.reads.queue_question(OffsetForTimeRequest,
                                                                                          inbound.payload)),
                ChangeInvisible: serving(lambda _o, inbound, _out: self.pops.change_invisible(
                    decode_as(ChangeInvisibleRequest, inbound.payload))),
                PopStats: serving(lambda _o, inbound, _out: self.pops.stats(decode_as(PopStatsRequest,
                                                                                      inbound.payload))),
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
        """Apply the log up to the readable end (one slice), wake what it touched, publish progress.

        The end is read before the deletions: the writer records a deletion before it appends
        anything past it, so every deletion of a topic whose records lie below that end is
        followed first. Otherwise a catch-up could build a deleted topic's new queue from records
        past the deletion, and the deletion, followed after, drop it whole."""
        end = self.reads.visible_end
        self.follow_deletions()
        self.wake(self.owned.catch_up(end))
        self.slots.set(owner_slot(self.instance), self.owned.applied_offset)

    def serving(self, serve: Callable[[Any, Inbound, Effects], bytes | None]) -> Handler:
        """A request's handler: ``serve`` gives the reply (None: it waits, parked, or went elsewhere);
        a RequestError is the client's error reply. Long polls that something woke are answered after.
        (Any: ``serve`` takes the order type it is registered under, as a ``Handler`` does.)"""

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
        return self.reads.pull(decode_as(PullRequest, inbound.payload), reply_to=inbound.origin)

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
        reply = self.pops.ack(decode_as(AckRequest, inbound.payload), out)
        self.wake_unlocked()
        return reply

    def pop(self, request: PopRequest, queue_ids: list[int], *, reply_to: Origin | None = None,
            final: bool = False, deadline_ms: int | None = None) -> bytes | None:
        """Serve a pop; None when it was parked to wait for a message (long polling)."""
        reply, empty = self.pops.pop(request, queue_ids)
        if empty and not final and request.max_wait_ms > 0 and reply_to is not None and \
                self.long_polls.park(reply_to, request, now_ms=self.clock.mono_ms(), deadline_ms=deadline_ms,
                                     queue_ids=queue_ids):
            return None
        return reply

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
                    reply = self.reads.pull(request, reply_to=parked.reply_to, final=final,
                                            deadline_ms=parked.deadline_ms)
            except RequestError as exc:
                reply = encode_error(request.id, exc.code, exc.message, **exc.details)
            if reply is None:
                continue  # still nothing: parked again, with its original deadline
            self.pops.reply(out, parked.reply_to, reply)

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
        return {"rmqpy_queue_pulled_messages": per_queue(self.reads.pulled_messages),
                "rmqpy_queue_pulled_bytes": per_queue(self.reads.pulled_bytes),
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
