"""The timer: moves each delayed or timed message to its real topic at its deliver time.

RocketMQ 5's ``TimerMessageStore`` (``docs/design.md`` 5.9). The writer stores a delayed
send in ``rmq_sys_wheel_timer`` queue 0 (``engine/services/writer/delivery_routes.py``). This
actor, a client of the front on its internal port:

* enqueues: pulls that queue (long polling) and, for each message, writes a 52-byte unit to
  the timer log and links it into the wheel slot of its deliver time
  (``engine/store/timer_files.py``). A pending timer costs disk, not memory;
* delivers: when a slot's time comes, reads its list, sorts it by deliver time, and sends
  each message, as its deliver time passes, to its real topic and queue (``send`` with
  ``ORIGIN_OFFSET``). A slot is done when every message in it is stored;
* checkpoints (``config/timercheck``): the log and the wheel synced, then how far both
  loops got. Read progress only passes moves the log has flushed.

Exactly once across a crash: a restart links again the units written past the checkpoint,
waits until any move still in the writer's queue is stored or refused
(``send_queue_wait_ms_max``), then reads the log from where the checkpoint's slot began and
skips every message whose move it finds there. A move whose reply is lost is settled the
same way. Messages a slot holds are read in memory one slot at a time.

The jobs are plain objects: the enqueue side in ``engine/services/timer/enqueue.py``,
the delivery side in ``engine/services/timer/delivery.py``; this actor holds the files,
the requests to the front and the checkpoint.
"""

from __future__ import annotations

import logging

from engine.actors.base import Actor, Env, Handler, Port, main
from engine.actors.effects import Effects
from engine.actors.front_requests import FrontRequests, QueueFollower, front_port
from engine.ipc.channels import Channel, ClientFrame
from engine.ipc.protocol import MessageView, SendMessage, SendReply, SendRequest
from engine.ipc.wire import Inbound
from engine.services.timer.delivery import TimerDelivery
from engine.services.timer.enqueue import TimerEnqueue
from engine.store.commit_log import CommitLogReader
from engine.store.shared_offsets import CONFIRMED, FLUSHED, TIMERS_PENDING
from engine.store.system_topics import TIMER_TOPIC
from engine.store.timer_files import (
    TimerCheckpoint,
    TimerLog,
    TimerWheel,
    Unit,
    load_timer_checkpoint,
    store_timer_checkpoint,
)

log = logging.getLogger(__name__)

_REQUEST_TIMEOUT_MS = 5_000
_SLOTS_PER_TURN_MAX = 4_096  # empty slots passed in one call while catching up


class TimerActor(Actor):
    """Takes replies on ``front``; gives pulls and moves (``send``) on ``front``."""

    tick_interval_ms = 10

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        cfg = env.config
        self.precision = cfg.timer_precision_ms
        self.log = TimerLog(env.store_dir, cfg.timer_log_segment_bytes,
                            reserve_step_bytes=cfg.timer_reserve_step_bytes)
        self.wheel = TimerWheel(env.store_dir, cfg.timer_wheel_slots, cfg.timer_precision_ms, sparse=True)
        self.reader = CommitLogReader.for_config(env.store_dir, cfg)
        self.enqueuing = TimerEnqueue(self.log, self.wheel, self.reader,
                                      span_ms=cfg.timer_wheel_slots * cfg.timer_precision_ms)
        self.delivery = TimerDelivery(self.log, self.wheel, self.reader, precision_ms=cfg.timer_precision_ms)
        self.disk = self.enqueuing.disk  # a full disk: checkpoints and enqueues wait, deliveries go on
        self.front = FrontRequests(env.clock)
        self.checkpoint = TimerCheckpoint()
        self.follower = QueueFollower(self.front, TIMER_TOPIC, 0)
        self.last_checkpoint_ms = 0

    def ports(self) -> list[Port]:
        return [front_port()]

    def recover(self, out: Effects) -> None:
        checkpoint = load_timer_checkpoint(self.env.store_dir)
        if checkpoint is None:
            now = self.clock.wall_ms()
            checkpoint = TimerCheckpoint(read_time_ms=now - now % self.precision,
                                         slot_log_start=self.slots.get(CONFIRMED))
        self.checkpoint = checkpoint
        end, relinked = self.enqueuing.recover(checkpoint, self.slots.get(CONFIRMED))
        self.delivery.recover(checkpoint, look_at_ms=self.look_wait_end())
        self.follower.next_offset = self.enqueuing.enqueue_next
        log.info("recovered: delivering from %d, enqueueing from queue offset %d, timer log end %d (%d units "
                 "linked again)", self.delivery.read_ms, self.enqueuing.enqueue_next, end, relinked)

    def look_wait_end(self) -> int:
        """When to look in the log for moves: once any move still in the writer's queue is stored or refused."""
        return self.clock.mono_ms() + self.config.send_queue_wait_ms_max + 200

    # -- enqueue -----------------------------------------------------------------------------

    def pull(self, out: Effects) -> None:
        if not self.enqueuing.sources:
            self.follower.pull(out, self.on_pulled)

    def on_pulled(self, messages: list[MessageView], out: Effects) -> None:
        self.enqueuing.take(messages)
        self.enqueue(out)

    def enqueue(self, out: Effects) -> None:
        self.delivery.add_due(self.enqueuing.enqueue(self.delivery.read_ms))

    # -- delivery ----------------------------------------------------------------------------

    def deliver(self, out: Effects) -> None:
        delivery = self.delivery
        if self.clock.mono_ms() < delivery.look_at_ms:
            return
        if delivery.look_pending and not delivery.look_for_moves(self.slots.get(CONFIRMED),
                                                                 self.config.catch_up_bytes_per_turn_max):
            return  # the next turn goes on with it
        now = self.clock.wall_ms()
        for _ in range(_SLOTS_PER_TURN_MAX):
            if not delivery.loaded:
                if delivery.read_ms > now:
                    return
                delivery.load_slot()
            self.move_due(out, now)
            if not delivery.slot_over(now):
                return
            delivery.finish_slot(self.slots.get(CONFIRMED), now)

    def backlog(self) -> bool:
        return self.delivery.look is not None

    def work_backlog(self, out: Effects) -> None:
        self.deliver(out)

    def move_due(self, out: Effects, now: int) -> None:
        """Send the messages whose time has come, grouped by destination, within the in-flight limit."""
        if self.clock.mono_ms() < self.delivery.retry_at_ms:
            return
        confirmed = self.slots.get(CONFIRMED)
        in_flight_max = self.config.timer_deliveries_in_flight_max
        while self.delivery.has_due(now) and len(self.front) < in_flight_max:
            for (topic, queue_id), batch in self.delivery.take_due(now, confirmed).items():
                self.send_moves(out, topic, queue_id, batch)

    def send_moves(self, out: Effects, topic: str, queue_id: int, batch: list[tuple[Unit, SendMessage]]) -> None:
        units = [unit for unit, _ in batch]

        def on_reply(reply: SendReply | None, later: Effects) -> None:
            self.delivery.moved(topic, units, reply, now_mono_ms=self.clock.mono_ms(),
                                look_wait_ms=self.config.send_queue_wait_ms_max + 200)

        self.front.send(out, SendRequest(op="send", topic=topic, queue_id=queue_id,
                                         messages=[message for _, message in batch]),
                        on_reply, timeout_ms=_REQUEST_TIMEOUT_MS)

    # -- checkpoint --------------------------------------------------------------------------

    def store_checkpoint(self) -> None:
        """Sync the log and the wheel, then record how far the flush lets both loops claim."""
        flushed = self.slots.get(FLUSHED)
        checkpoint = self.checkpoint
        self.delivery.progress(checkpoint, flushed)
        checkpoint.enqueue_next, checkpoint.log_end = self.enqueuing.durable(flushed)
        checkpoint.files_due_until = dict(self.enqueuing.due_until)
        self.log.flush()
        self.wheel.write_dirty()
        store_timer_checkpoint(self.env.store_dir, checkpoint)
        self.enqueuing.delete_delivered(checkpoint.read_time_ms, checkpoint.log_end)
        self.slots.set(TIMERS_PENDING, self.pending())

    def pending(self) -> int:
        return max(0, self.enqueuing.enqueue_next - self.delivery.delivered) + len(self.enqueuing.sources)

    def handlers(self) -> dict[type, Handler]:
        return {ClientFrame: self.on_front_reply}

    def on_front_reply(self, _frame: ClientFrame, inbound: Inbound, out: Effects) -> None:
        self.front.handle_reply(inbound.payload, out)
        self.enqueue(out)
        self.deliver(out)

    def connection(self, channel: Channel, up: bool) -> None:
        if not up:
            self.front.lost()  # handed back at the next tick, their outcome unknown

    def tick(self, out: Effects) -> None:
        self.front.expire(out)
        self.enqueue(out)
        self.pull(out)
        self.deliver(out)
        now = self.clock.mono_ms()
        if now - self.last_checkpoint_ms >= self.config.timer_checkpoint_interval_ms:
            self.last_checkpoint_ms = now
            try:
                self.store_checkpoint()
            except OSError as exc:  # the wheel's new page or the checkpoint file: the next interval retries
                self.disk.refused(exc)
            else:
                self.disk.written()

    def detail(self) -> dict[str, int]:
        return {"read_time_ms": self.delivery.read_ms, "enqueue_next": self.enqueuing.enqueue_next,
                "pending": self.pending(), "delivered": self.delivery.delivered, "dropped": self.delivery.dropped,
                "log_end": self.log.end, "disk_refusals": self.disk.count}

    def condition(self) -> str:
        return self.disk.condition()

    def shutdown(self, out: Effects) -> None:
        try:
            self.store_checkpoint()
        except OSError as exc:  # a full disk: the restart recovers from the last checkpoint
            self.disk.refused(exc)
        self.log.close()
        self.wheel.close()


if __name__ == "__main__":
    raise SystemExit(main(TimerActor))
