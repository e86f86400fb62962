"""The timer: moves each delayed or timed message to its real topic at its deliver time.

RocketMQ 5's ``TimerMessageStore`` (``docs/design.md`` 5.9). The writer stores a delayed
send in ``rmq_sys_wheel_timer`` queue 0 (``engine/services/delivery_routes.py``). This
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
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from engine.actors.base import Actor, Env, Handler, Port, main
from engine.actors.effects import Effects
from engine.actors.front_requests import FrontRequests, QueueFollower, Reply, front_port
from engine.errors import ErrorCode
from engine.ipc.channels import Channel, ClientFrame
from engine.ipc.wire import Inbound
from engine.layout import Record, RecordError, java_string_hash
from engine.services.moved_records import MoveSearch
from engine.store.commit_log import CommitLogReader
from engine.store.disk_refusals import DiskRefusals
from engine.store.shared_offsets import CONFIRMED, FLUSHED, TIMERS_PENDING
from engine.store.system_topics import (
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_OUT_MS,
    TIMER_TOPIC,
    moved_view_message,
    real_destination,
)
from engine.store.timer_files import (
    NO_UNIT,
    UNIT_BYTES,
    TimerCheckpoint,
    TimerLog,
    TimerWheel,
    Unit,
    load_timer_checkpoint,
    store_timer_checkpoint,
)

log = logging.getLogger(__name__)

_REQUEST_TIMEOUT_MS = 5_000
_MOVE_MESSAGES_MAX = 64
_SLOTS_PER_TURN_MAX = 4_096  # empty slots passed in one call while catching up
# Refusals after which nothing was stored: the move is tried again. Any other refusal is
# final for that message (its topic or queue is gone): it is counted and logged.
_RETRY = {ErrorCode.BUSY, ErrorCode.SERVICE_NOT_AVAILABLE, ErrorCode.DISK_FULL, ErrorCode.TIMEOUT}


@dataclass
class Source:
    """A message pulled from rmq_sys_wheel_timer, waiting for the flush to pass it."""

    queue_offset: int
    commit_log_offset: int
    size: int
    store_ms: int
    deliver_ms: int
    topic_hash: int


@dataclass
class Done:
    """A delivered slot, checkpointed once the flush passes its last move."""

    next_read_ms: int
    next_slot_log_start: int
    last_move_offset: int
    delivered: int


Due = tuple[int, int, Unit]  # (deliver ms, timer-log position, unit): a plain tuple, for the heap's speed


class TimerActor(Actor):
    """Takes replies on ``front``; gives pulls and moves (``send``) on ``front``."""

    tick_interval_ms = 10

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        cfg = env.config
        self.precision = cfg.timer_precision_ms
        self.span_ms = cfg.timer_wheel_slots * cfg.timer_precision_ms
        self.log = TimerLog(env.store_dir, cfg.timer_log_segment_bytes,
                            reserve_step_bytes=cfg.timer_reserve_step_bytes)
        self.wheel = TimerWheel(env.store_dir, cfg.timer_wheel_slots, cfg.timer_precision_ms, sparse=True)
        self.reader = CommitLogReader.for_config(env.store_dir, cfg)
        self.front = FrontRequests(env.clock)
        self.checkpoint = TimerCheckpoint()
        self.enqueue_next = 0
        self.follower = QueueFollower(self.front, TIMER_TOPIC, 0)
        self.sources: deque[Source] = deque()
        self.read_ms = 0  # the slot being delivered (its start)
        self.slot_log_start = 0
        self.loaded = False
        self.due: list[Due] = []
        self.moving = 0  # messages of the loaded slot in moves not answered yet
        self.last_move_offset = 0  # the highest commit-log offset of a move of the loaded slot
        self.done: deque[Done] = deque()
        self.already_moved: set[int] = set()  # found in the log by the last look; never moved again
        self.looked_from = 0  # where the looks that found ``already_moved`` began
        self.look_at_ms = 0  # mono ms when to look in the log for moves (after a start or a lost reply)
        self.look_pending = True
        self.look: MoveSearch | None = None  # the look under way, a slice a turn
        self.last_checkpoint_ms = 0
        self.disk = DiskRefusals("timer")  # a full disk: checkpoints and enqueues wait, deliveries go on
        self.delivered = 0
        self.dropped = 0
        # (end of the source in the log, enqueue_next and timer-log end after it): the checkpoint takes
        # the last one the flush has passed, so that it never counts a source a power cut may take
        self.enqueued: deque[tuple[int, int, int]] = deque()
        self.due_until: dict[int, int] = {}  # timer-log file start -> the latest deliver time in it
        self.enqueue_durable = (0, 0)  # (enqueue_next, log end) the checkpoint may name
        self.retry_at_ms = 0
        self.delivered_at_slot_start = 0

    def ports(self) -> list[Port]:
        return [front_port()]

    # -- recovery ----------------------------------------------------------------------------

    def recover(self, out: Effects) -> None:
        checkpoint = load_timer_checkpoint(self.env.store_dir)
        if checkpoint is None:
            now = self.clock.wall_ms()
            checkpoint = TimerCheckpoint(read_time_ms=now - now % self.precision,
                                         slot_log_start=self.slots.get(CONFIRMED))
        self.checkpoint = checkpoint
        self.read_ms, self.slot_log_start = checkpoint.read_time_ms, checkpoint.slot_log_start
        self.enqueue_next, self.delivered = checkpoint.enqueue_next, checkpoint.delivered
        self.delivered_at_slot_start = self.delivered
        self.enqueue_durable = (checkpoint.enqueue_next, checkpoint.log_end)
        present = set(self.log.files.known)
        self.due_until = {start: until for start, until in checkpoint.files_due_until.items() if start in present}
        end, relinked = checkpoint.log_end, 0
        confirmed = self.slots.get(CONFIRMED)
        for unit in self.log.units_from(checkpoint.log_end):
            record = self.source(unit, confirmed)
            if record is None:
                break
            self.wheel.relink(self.wheel.slot_start(unit.deliver_ms), unit)
            self.note_due(unit.pos, unit.deliver_ms)
            self.enqueue_next = max(self.enqueue_next, record.queue_offset + 1)
            end, relinked = unit.pos + UNIT_BYTES, relinked + 1
        self.unlink_lost(end)
        self.log.open_at(end)
        self.follower.next_offset = self.enqueue_next
        self.look_at_ms = self.clock.mono_ms() + self.config.send_queue_wait_ms_max + 200
        log.info("recovered: delivering from %d, enqueueing from queue offset %d, timer log end %d (%d units "
                 "linked again)", self.read_ms, self.enqueue_next, end, relinked)

    def note_due(self, pos: int, deliver_ms: int) -> None:
        start = self.log.files.file_start(pos)
        self.due_until[start] = max(self.due_until.get(start, 0), deliver_ms)

    def unlink_lost(self, end: int) -> None:
        """Units past ``end`` name messages a power cut took (the log lost its tail under ASYNC_FLUSH):
        a wheel slot written at a checkpoint may still hold them. Take them out of their lists, the
        newest first, and write the wheel before the log's tail is zeroed."""
        lost = list(self.log.units_from(end))
        for unit in reversed(lost):
            slot_start = self.wheel.slot_start(unit.deliver_ms)
            slot = self.wheel.get(slot_start)
            if slot.units and slot.last_pos == unit.pos:
                self.wheel.unlink_head(slot_start, unit.prev_pos)
        if lost:
            log.warning("%d timer units past %d name messages the log no longer holds: unlinked", len(lost), end)
        self.wheel.write_dirty()

    def source(self, unit: Unit, confirmed: int) -> Record | None:
        """The rmq_sys_wheel_timer record of ``unit``, or None if the log does not hold it (any more)."""
        if unit.offset_py + unit.size_py > confirmed:
            return None
        try:
            record = self.reader.read(unit.offset_py, limit=confirmed)
        except RecordError as exc:
            log.error("the timer unit at %d names a record at %d that cannot be read: %s", unit.pos, unit.offset_py,
                      exc.reason)
            return None
        if record.topic != TIMER_TOPIC or record.total_size != unit.size_py \
                or record.store_timestamp_ms != unit.write_ms:
            # after a power cut under ASYNC_FLUSH: the message was lost with the log's tail
            log.warning("the timer unit at %d names a record at %d that is not its message", unit.pos, unit.offset_py)
            return None
        return record

    def source_view(self, unit: Unit, confirmed: int) -> dict[str, Any] | None:
        """``source``, as the C codec reads it: the record's message map."""
        if unit.offset_py + unit.size_py > confirmed:
            return None
        try:
            view = self.reader.read_view(unit.offset_py, limit=confirmed)
        except RecordError:
            view = None
        if view is None or view["topic"] != TIMER_TOPIC or view["store_size"] != unit.size_py \
                or view["store_timestamp"] != unit.write_ms:
            self.source(unit, confirmed)  # logs why
            return None
        return view

    # -- enqueue -----------------------------------------------------------------------------

    def pull(self, out: Effects) -> None:
        if not self.sources:
            self.follower.pull(out, self.on_pulled)

    def on_pulled(self, messages: list[dict[str, Any]], out: Effects) -> None:
        for message in messages:
            properties = message["properties"]
            try:
                deliver_ms = int(properties.get(PROPERTY_TIMER_OUT_MS, "0"))
            except ValueError:
                deliver_ms = 0
            self.sources.append(Source(message["queue_offset"], message["commit_log_offset"], message["store_size"],
                                       message["store_timestamp"], deliver_ms,
                                       java_string_hash(properties.get(PROPERTY_REAL_TOPIC, ""))))
        self.enqueue(out)

    def enqueue(self, out: Effects) -> None:
        """A unit in the log and a link in the wheel for each pulled message."""
        while self.sources:
            source = self.sources[0]
            at = max(source.deliver_ms, self.read_ms)  # already due: in the slot being delivered
            slot_start = self.wheel.slot_start(at)
            if slot_start - self.read_ms >= self.span_ms:
                return  # the wheel would wrap onto undelivered slots: wait for delivery to catch up
            slot = self.wheel.get(slot_start)
            unit = Unit(self.log.end, slot.last_pos if slot.units else NO_UNIT, source.store_ms,
                        at - source.store_ms, source.commit_log_offset, source.size, source.topic_hash)
            try:
                self.log.append(unit.prev_pos, unit.write_ms, unit.delay_ms, unit.offset_py, unit.size_py,
                                unit.topic_hash)
            except OSError as exc:  # no blocks for the unit (a full disk): this source waits, in order
                self.disk.refused(exc)
                return
            self.sources.popleft()
            self.wheel.link(slot_start, unit.pos)
            self.note_due(unit.pos, at)
            self.enqueue_next = source.queue_offset + 1
            self.enqueued.append((source.commit_log_offset + source.size, self.enqueue_next, self.log.end))
            if self.loaded and slot_start == self.read_ms:
                heapq.heappush(self.due, (at, unit.pos, unit))

    # -- delivery ----------------------------------------------------------------------------

    def deliver(self, out: Effects) -> None:
        if self.clock.mono_ms() < self.look_at_ms:
            return
        if self.look_pending and not self.look_for_moves():
            return  # the next turn goes on with it
        now = self.clock.wall_ms()
        for _ in range(_SLOTS_PER_TURN_MAX):
            if not self.loaded:
                if self.read_ms > now:
                    return
                self.load_slot()
            self.move_due(out, now)
            if self.due or self.moving or now < self.read_ms + self.precision:
                return
            self.finish_slot()

    def look_for_moves(self) -> bool:
        """One slice of the look for moves already in the log since the checkpoint's slot began (a
        restart, a lost reply); True once it is done. Nothing is delivered before."""
        if self.look is None:
            self.looked_from = min(self.looked_from, self.slot_log_start) if self.already_moved \
                else self.slot_log_start
            self.look = MoveSearch(self.reader, self.slot_log_start, self.slots.get(CONFIRMED))
        look = self.look
        look.step(self.config.catch_up_bytes_per_turn_max)
        if not look.done:
            return False
        self.look, self.look_pending = None, False
        self.already_moved |= look.found
        if look.found:
            log.info("%d moves found in the log since %d: they are not made again", len(look.found), look.start)
        return True

    def backlog(self) -> bool:
        return self.look is not None

    def work_backlog(self, out: Effects) -> None:
        self.deliver(out)

    def load_slot(self) -> None:
        slot = self.wheel.get(self.read_ms)
        units: list[Unit] = []
        pos = slot.last_pos if slot.units else NO_UNIT
        while pos != NO_UNIT and len(units) < slot.units:
            unit = self.log.read(pos) if pos < self.log.end else None
            if unit is None:
                log.error("the timer list of slot %d breaks at %d: %d of %d units read", self.read_ms, pos,
                          len(units), slot.units)
                break
            units.append(unit)
            pos = unit.prev_pos
        self.due = [(unit.deliver_ms, unit.pos, unit) for unit in units]
        heapq.heapify(self.due)
        self.loaded = True
        self.delivered_at_slot_start = self.delivered
        self.last_move_offset = 0

    def move_due(self, out: Effects, now: int) -> None:
        """Send the messages whose time has come, grouped by destination, within the in-flight limit."""
        confirmed = self.slots.get(CONFIRMED)
        if self.clock.mono_ms() < self.retry_at_ms:
            return
        in_flight_max = self.config.timer_deliveries_in_flight_max
        while self.due and self.due[0][0] <= now and len(self.front) < in_flight_max:
            batches: dict[tuple[str, int], list[tuple[Unit, dict[str, object]]]] = {}
            taken = 0
            while self.due and self.due[0][0] <= now and taken < _MOVE_MESSAGES_MAX:
                taken += 1
                unit = heapq.heappop(self.due)[2]
                if unit.offset_py in self.already_moved:
                    self.already_moved.discard(unit.offset_py)
                    self.delivered += 1
                    continue
                view = self.source_view(unit, confirmed)
                destination = real_destination(view["properties"]) if view is not None else None
                if view is None or destination is None:
                    self.dropped += 1
                    self.delivered += 1
                    continue
                batch = batches.setdefault(destination, [])
                batch.append((unit, moved_view_message(view)))
                if len(batch) >= _MOVE_MESSAGES_MAX:
                    break
            for (topic, queue_id), batch in batches.items():
                self.send_moves(out, topic, queue_id, batch)

    def send_moves(self, out: Effects, topic: str, queue_id: int, batch: list[tuple[Unit, dict[str, object]]]) -> None:
        units = [unit for unit, _ in batch]
        self.moving += len(units)

        def on_reply(reply: Reply, later: Effects) -> None:
            self.moving -= len(units)
            self.on_moved(topic, units, reply)

        self.front.send(out, "send", on_reply, timeout_ms=_REQUEST_TIMEOUT_MS, topic=topic, queue_id=queue_id,
                        messages=[message for _, message in batch])

    def on_moved(self, topic: str, units: list[Unit], reply: Reply) -> None:
        if reply is not None and reply.get("ok"):
            self.delivered += len(units)
            offsets = [result.get("commit_log_offset", 0) for result in reply.get("results", ())]
            self.last_move_offset = max([self.last_move_offset, *offsets])
            return
        code = reply["error"]["code"] if reply is not None else None
        if code is not None and code not in _RETRY:
            self.dropped += len(units)
            self.delivered += len(units)
            log.error("%d delayed messages for topic %r cannot be delivered: %s", len(units), topic,
                      reply["error"]["message"] if reply else "")
            return
        for unit in units:  # stored or not: look in the log before trying again
            heapq.heappush(self.due, (unit.deliver_ms, unit.pos, unit))
        self.retry_at_ms = self.clock.mono_ms() + 100
        if code is None or code == ErrorCode.TIMEOUT:
            self.look_pending = True
            self.look = None  # a look under way ends before this move: look again, to the end
            self.look_at_ms = self.clock.mono_ms() + self.config.send_queue_wait_ms_max + 200

    def finish_slot(self) -> None:
        """The next slot begins where the log ends now, unless moves a look found are still to
        be met: a restarted timer catching up reaches slots it (or the run before) moved
        already, and their moves lie below the log's end now. Such a slot begins where
        the look began, so that the checkpoint never names a start past its moves."""
        next_read = self.read_ms + self.precision
        self.loaded = False
        if self.already_moved and not self.look_pending and next_read > self.clock.wall_ms():
            self.already_moved.clear()  # every move made before the look was due before now
        next_start = self.slots.get(CONFIRMED)
        if self.already_moved:
            next_start = min(next_start, self.looked_from)
        self.done.append(Done(next_read, next_start, self.last_move_offset, self.delivered))
        self.read_ms, self.slot_log_start = next_read, next_start

    # -- checkpoint --------------------------------------------------------------------------

    def store_checkpoint(self) -> None:
        """Sync the log and the wheel, then record how far the flush lets both loops claim."""
        flushed = self.slots.get(FLUSHED)
        checkpoint = self.checkpoint
        while self.done and self.done[0].last_move_offset < flushed:
            done = self.done.popleft()
            checkpoint.read_time_ms, checkpoint.slot_log_start = done.next_read_ms, done.next_slot_log_start
            checkpoint.delivered = done.delivered
        if not self.done and self.last_move_offset < flushed:  # the slot being delivered, as it began
            checkpoint.read_time_ms, checkpoint.slot_log_start = self.read_ms, self.slot_log_start
            checkpoint.delivered = self.delivered_at_slot_start if self.loaded else self.delivered
        while self.enqueued and self.enqueued[0][0] <= flushed:
            _end, enqueue_next, log_end = self.enqueued.popleft()
            self.enqueue_durable = (enqueue_next, log_end)
        checkpoint.enqueue_next, checkpoint.log_end = self.enqueue_durable
        checkpoint.files_due_until = dict(self.due_until)
        self.log.flush()
        self.wheel.write_dirty()
        store_timer_checkpoint(self.env.store_dir, checkpoint)
        for start in self.log.delete_delivered(self.due_until, checkpoint.read_time_ms):
            del self.due_until[start]  # the next checkpoint forgets it; a restart before skips what is gone
            log.info("timer log file %d: every unit delivered; deleted", start)
        self.slots.set(TIMERS_PENDING, self.pending())

    def pending(self) -> int:
        return max(0, self.enqueue_next - self.delivered) + len(self.sources)

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
        return {"read_time_ms": self.read_ms, "enqueue_next": self.enqueue_next, "pending": self.pending(),
                "delivered": self.delivered, "dropped": self.dropped, "log_end": self.log.end,
                "disk_refusals": self.disk.count}

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
