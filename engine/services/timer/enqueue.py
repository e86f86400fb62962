"""The timer's enqueue side: each delayed message pulled from ``rmq_sys_wheel_timer`` becomes a
52-byte unit in the timer log, linked into the wheel slot of its deliver time
(``engine/store/timer_files.py``). A pending timer costs disk, not memory.

Called by the timer actor (``engine/actors/timer.py``): ``take`` with each pulled batch,
``enqueue`` every turn, ``recover`` at its start and ``durable`` at each checkpoint. It also
reads a unit's source record back from the log (``read_source``), for recovery here and for
delivery (``engine/services/timer/delivery.py``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from engine.ipc.protocol import MessageView
from engine.layout import Record, RecordError, java_string_hash
from engine.store.commit_log import CommitLogReader
from engine.store.disk_refusals import DiskRefusals
from engine.store.system_topics import (
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_OUT_MS,
    TIMER_TOPIC,
    moved_message,
    moved_view_message,
    real_destination,
)
from engine.store.timer_files import NO_UNIT, UNIT_BYTES, TimerCheckpoint, TimerLog, TimerWheel, Unit

log = logging.getLogger(__name__)


@dataclass
class Source:
    """A message pulled from rmq_sys_wheel_timer, waiting for its unit."""

    queue_offset: int
    commit_log_offset: int
    size: int
    store_ms: int
    deliver_ms: int
    topic_hash: int


def read_source(reader: CommitLogReader, unit: Unit, confirmed: int) -> Record | None:
    """The rmq_sys_wheel_timer record of ``unit``, or None if the log does not hold it (any more)."""
    if unit.offset_py + unit.size_py > confirmed:
        return None
    try:
        record = reader.read(unit.offset_py, limit=confirmed)
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


Move = tuple[tuple[str, int], dict[str, object]]  # (real topic, queue id), the send's message map


def source_move(reader: CommitLogReader, unit: Unit, confirmed: int) -> tuple[Move | None, str]:
    """The move of ``unit``'s message to its real topic and queue (``moved_view_message``: the
    record as the C codec reads it, the delivery's hot path); or None and
    why it cannot be made. A record the codec refuses and the Python decoder reads whole is
    moved as that one reads it: a message is never dropped while its record can be read."""
    if unit.offset_py + unit.size_py > confirmed:
        return None, f"its record at {unit.offset_py} ends past the log's confirmed end {confirmed}"
    try:
        view = reader.read_view(unit.offset_py, limit=confirmed)
    except RecordError:
        view = None
    if view is not None and view["topic"] == TIMER_TOPIC and view["store_size"] == unit.size_py \
            and view["store_timestamp"] == unit.write_ms:
        message, properties = moved_view_message(view), view["properties"]
    else:
        record = read_source(reader, unit, confirmed)  # logs why, when it is not the unit's message
        if record is None:
            return None, f"its record at {unit.offset_py} cannot be read, or is another message"
        log.warning("the timer unit at %d: the codec and the decoder disagree on the record at %d; moved as "
                    "the decoder reads it", unit.pos, unit.offset_py)
        message, properties = moved_message(record), record.properties
    destination = real_destination(properties)
    if destination is None:
        return None, f"its record at {unit.offset_py} names no real topic and queue"
    return (destination, message), ""


class TimerEnqueue:
    """Pulled messages into units of the log, linked into the wheel; what a checkpoint may claim."""

    def __init__(self, log_: TimerLog, wheel: TimerWheel, reader: CommitLogReader, *, span_ms: int) -> None:
        self.log = log_
        self.wheel = wheel
        self.reader = reader
        self.span_ms = span_ms  # the wheel's reach: a unit further ahead waits
        self.sources: deque[Source] = deque()
        self.enqueue_next = 0  # the next rmq_sys_wheel_timer queue offset to enqueue
        # (end of the source in the log, enqueue_next and timer-log end after it): the checkpoint takes
        # the last one the flush has passed, so that it never counts a source a power cut may take
        self.enqueued: deque[tuple[int, int, int]] = deque()
        self.durable_marks = (0, 0)  # (enqueue_next, log end) the checkpoint may name
        self.due_until: dict[int, int] = {}  # timer-log file start -> the latest deliver time in it
        self.disk = DiskRefusals("timer")  # a full disk: checkpoints and enqueues wait, deliveries go on

    # -- recovery --------------------------------------------------------------------------------

    def recover(self, checkpoint: TimerCheckpoint, confirmed: int) -> tuple[int, int]:
        """Link again the units written past the checkpoint; (log end, units linked again)."""
        self.enqueue_next = checkpoint.enqueue_next
        self.durable_marks = (checkpoint.enqueue_next, checkpoint.log_end)
        present = set(self.log.files.known)
        self.due_until = {start: until for start, until in checkpoint.files_due_until.items() if start in present}
        end, relinked = checkpoint.log_end, 0
        for unit in self.log.units_from(checkpoint.log_end):
            record = read_source(self.reader, unit, confirmed)
            if record is None:
                break
            self.wheel.relink(self.wheel.slot_start(unit.deliver_ms), unit)
            self.note_due(unit.pos, unit.deliver_ms)
            self.enqueue_next = max(self.enqueue_next, record.queue_offset + 1)
            end, relinked = unit.pos + UNIT_BYTES, relinked + 1
        self.unlink_lost(end)
        self.log.open_at(end)
        return end, relinked

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

    def note_due(self, pos: int, deliver_ms: int) -> None:
        start = self.log.files.file_start(pos)
        self.due_until[start] = max(self.due_until.get(start, 0), deliver_ms)

    # -- enqueue ---------------------------------------------------------------------------------

    def take(self, messages: Iterable[MessageView]) -> None:
        """The pulled messages, in queue order, as sources waiting for their unit."""
        for message in messages:
            properties = message.properties
            try:
                deliver_ms = int(properties.get(PROPERTY_TIMER_OUT_MS, "0"))
            except ValueError:
                deliver_ms = 0
            self.sources.append(Source(message.queue_offset, message.commit_log_offset, message.store_size,
                                       message.store_timestamp, deliver_ms,
                                       java_string_hash(properties.get(PROPERTY_REAL_TOPIC, ""))))

    def enqueue(self, read_ms: int) -> list[Unit]:
        """A unit in the log and a link in the wheel for each source, in order, up to the wheel's
        reach from ``read_ms`` (the slot being delivered); the units linked into that slot."""
        now_due: list[Unit] = []
        while self.sources:
            source = self.sources[0]
            at = max(source.deliver_ms, read_ms)  # already due: in the slot being delivered
            slot_start = self.wheel.slot_start(at)
            if slot_start - read_ms >= self.span_ms:
                break  # the wheel would wrap onto undelivered slots: wait for delivery to catch up
            slot = self.wheel.get(slot_start)
            unit = Unit(self.log.end, slot.last_pos if slot.units else NO_UNIT, source.store_ms,
                        at - source.store_ms, source.commit_log_offset, source.size, source.topic_hash)
            try:
                self.log.append(unit.prev_pos, unit.write_ms, unit.delay_ms, unit.offset_py, unit.size_py,
                                unit.topic_hash)
            except OSError as exc:  # no blocks for the unit (a full disk): this source waits, in order
                self.disk.refused(exc)
                break
            self.sources.popleft()
            self.wheel.link(slot_start, unit.pos)
            self.note_due(unit.pos, at)
            self.enqueue_next = source.queue_offset + 1
            self.enqueued.append((source.commit_log_offset + source.size, self.enqueue_next, self.log.end))
            if slot_start == read_ms:
                now_due.append(unit)
        return now_due

    def durable(self, flushed: int) -> tuple[int, int]:
        """(enqueue_next, log end) as far as the flush has passed the sources."""
        while self.enqueued and self.enqueued[0][0] <= flushed:
            _end, enqueue_next, log_end = self.enqueued.popleft()
            self.durable_marks = (enqueue_next, log_end)
        return self.durable_marks

    def delete_delivered(self, read_time_ms: int, recovery_from: int) -> None:
        """Delete the log files whose every unit is delivered (the checkpoint says so, written before),
        below the file of the checkpoint's log end (``recovery_from``)."""
        for start in self.log.delete_delivered(self.due_until, read_time_ms, recovery_from=recovery_from):
            del self.due_until[start]  # the next checkpoint forgets it; a restart before skips what is gone
            log.info("timer log file %d: every unit delivered; deleted", start)
