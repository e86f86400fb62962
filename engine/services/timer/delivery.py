"""The timer's delivery side: which delayed messages are due, and what became of their moves.

When a wheel slot's time comes, its list is read from the timer log into a heap by deliver
time (``load_slot``); each message, as its deliver time passes, is handed out for a move to
its real topic and queue (``take_due``: batches by destination, as ``SendMessage``s with
``ORIGIN_OFFSET``). A slot is done (``finish_slot``) when every move of it is stored. A
move whose reply is lost, and every start, is settled by a look in the log for the moves
already stored (``look_for_moves``, ``engine/services/moved_records.py``): what it finds is
never moved again.

Called by the timer actor (``engine/actors/timer.py``), which sends the moves to the front
and hands each reply back to ``moved``; the actor's checkpoint asks ``progress`` how far
the flush lets it claim.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from dataclasses import dataclass

from engine.ipc.protocol import SendMessage, SendReply
from engine.services.moved_records import MoveOutcome, MoveSearch, as_send_message, move_outcome, refusal
from engine.services.timer.enqueue import source_move
from engine.store.commit_log import CommitLogReader
from engine.store.timer_files import NO_UNIT, TimerCheckpoint, TimerLog, TimerWheel, Unit

log = logging.getLogger(__name__)

MOVE_MESSAGES_MAX = 64  # messages in one move (one send)
_RETRY_AFTER_MS = 100

Due = tuple[int, int, Unit]  # (deliver ms, timer-log position, unit): a plain tuple, for the heap's speed
Moves = dict[tuple[str, int], list[tuple[Unit, SendMessage]]]  # (topic, queue id) -> its messages


@dataclass
class Done:
    """A delivered slot, checkpointed once the flush passes its last move."""

    next_read_ms: int
    next_slot_log_start: int
    last_move_offset: int
    delivered: int


class TimerDelivery:
    """The slot being delivered, its heap of due units, the moves in flight and the slots done."""

    def __init__(self, log_: TimerLog, wheel: TimerWheel, reader: CommitLogReader, *, precision_ms: int) -> None:
        self.log = log_
        self.wheel = wheel
        self.reader = reader
        self.precision = precision_ms
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
        self.retry_at_ms = 0
        self.delivered = 0
        self.dropped = 0
        self.delivered_at_slot_start = 0

    def recover(self, checkpoint: TimerCheckpoint, *, look_at_ms: int) -> None:
        self.read_ms, self.slot_log_start = checkpoint.read_time_ms, checkpoint.slot_log_start
        self.delivered = self.delivered_at_slot_start = checkpoint.delivered
        self.look_at_ms = look_at_ms

    # -- the slot ----------------------------------------------------------------------------

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

    def add_due(self, units: list[Unit]) -> None:
        """Units just linked into the slot being delivered: into its heap, if it is loaded."""
        if self.loaded:
            for unit in units:
                heapq.heappush(self.due, (unit.deliver_ms, unit.pos, unit))

    def has_due(self, now: int) -> bool:
        return bool(self.due) and self.due[0][0] <= now

    def slot_over(self, now: int) -> bool:
        """Every message of the loaded slot moved, and its time passed."""
        return not self.due and not self.moving and now >= self.read_ms + self.precision

    def take_due(self, now: int, confirmed: int) -> Moves:
        """Up to ``MOVE_MESSAGES_MAX`` messages whose time has come, grouped by destination; those
        a look found moved already, and those that cannot be read or have no destination, are
        counted delivered here."""
        moves: Moves = {}
        taken = 0
        while self.due and self.due[0][0] <= now and taken < MOVE_MESSAGES_MAX:
            taken += 1
            unit = heapq.heappop(self.due)[2]
            if unit.offset_py in self.already_moved:
                self.already_moved.discard(unit.offset_py)
                self.delivered += 1
                continue
            move, why = source_move(self.reader, unit, confirmed)
            if move is None:
                self.dropped += 1
                self.delivered += 1
                log.error("the delayed message of timer unit %d (due %d) cannot be delivered: %s", unit.pos,
                          unit.deliver_ms, why)
                continue
            destination, message = move
            batch = moves.setdefault(destination, [])
            batch.append((unit, as_send_message(message)))
            if len(batch) >= MOVE_MESSAGES_MAX:
                break
        for batch in moves.values():
            self.moving += len(batch)
        return moves

    def moved(self, topic: str, units: list[Unit], reply: SendReply | None, *, now_mono_ms: int,
              look_wait_ms: int) -> None:
        """The outcome of a move: stored, refused for good, or to try again (after a look in the log
        when its reply was lost: it may be stored)."""
        self.moving -= len(units)
        outcome = move_outcome(reply)
        if outcome is MoveOutcome.STORED:
            assert reply is not None
            self.delivered += len(units)
            self.last_move_offset = max([self.last_move_offset, *(r.commit_log_offset for r in reply.results)])
            return
        if outcome is MoveOutcome.REFUSED:
            self.dropped += len(units)
            self.delivered += len(units)
            log.error("%d delayed messages for topic %r cannot be delivered: %s", len(units), topic, refusal(reply))
            return
        for unit in units:  # stored or not: look in the log before trying again
            heapq.heappush(self.due, (unit.deliver_ms, unit.pos, unit))
        self.retry_at_ms = now_mono_ms + _RETRY_AFTER_MS
        if outcome is MoveOutcome.UNKNOWN:
            self.look_pending = True
            self.look = None  # a look under way ends before this move: look again, to the end
            self.look_at_ms = now_mono_ms + look_wait_ms

    def finish_slot(self, confirmed: int, now: int) -> None:
        """The next slot begins where the log ends now, unless moves a look found are still to
        be met: a restarted timer catching up reaches slots it (or the run before) moved
        already, and their moves lie below the log's end now. Such a slot begins where
        the look began, so that the checkpoint never names a start past its moves."""
        next_read = self.read_ms + self.precision
        self.loaded = False
        if self.already_moved and not self.look_pending and next_read > now:
            self.already_moved.clear()  # every move made before the look was due before now
        next_start = confirmed
        if self.already_moved:
            next_start = min(next_start, self.looked_from)
        self.done.append(Done(next_read, next_start, self.last_move_offset, self.delivered))
        self.read_ms, self.slot_log_start = next_read, next_start

    # -- the look for moves already made ------------------------------------------------------

    def look_for_moves(self, confirmed: int, step_bytes: int) -> bool:
        """One slice of the look for moves already in the log since the checkpoint's slot began (a
        restart, a lost reply); True once it is done. Nothing is delivered before."""
        if self.look is None:
            self.looked_from = min(self.looked_from, self.slot_log_start) if self.already_moved \
                else self.slot_log_start
            self.look = MoveSearch(self.reader, self.slot_log_start, confirmed)
        look = self.look
        look.step(step_bytes)
        if not look.done:
            return False
        self.look, self.look_pending = None, False
        self.already_moved |= look.found
        if look.found:
            log.info("%d moves found in the log since %d: they are not made again", len(look.found), look.start)
        return True

    # -- the checkpoint ----------------------------------------------------------------------

    def progress(self, checkpoint: TimerCheckpoint, flushed: int) -> None:
        """Into ``checkpoint``: the slots whose moves the flush has passed."""
        while self.done and self.done[0].last_move_offset < flushed:
            done = self.done.popleft()
            checkpoint.read_time_ms, checkpoint.slot_log_start = done.next_read_ms, done.next_slot_log_start
            checkpoint.delivered = done.delivered
        if not self.done and self.last_move_offset < flushed:  # the slot being delivered, as it began
            checkpoint.read_time_ms, checkpoint.slot_log_start = self.read_ms, self.slot_log_start
            checkpoint.delivered = self.delivered_at_slot_start if self.loaded else self.delivered
