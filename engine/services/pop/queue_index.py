"""The queue index of one (group, topic, queue): a pop group's ack state, RabbitMQ's queue index.

One ``QueueIndex`` per (group, topic, queue) that the owner of the queue holds
(``index_set.IndexSet`` opens them; ``delivery.py`` changes them). Its
files are ``engine/store/pop_files.py``'s: a journal of fixed entries and segment
files of 16,384 entry states. In memory it keeps:

* the segments it has touched, as the bytes of their entries (folded by writing
  them whole);
* the **pop cursor**: every queue offset below it was delivered once or skipped
  (not matched by the subscription, or deleted by retention); none at or past it
  has any state. Below the cursor, an entry that is still NONE was skipped since
  the last fold; the fold writes it as SKIPPED;
* ``due``: delivered offsets whose invisible time passed, redelivered first;
* the counters ``stats`` reports.

Rules, after ``rabbit_queue_index``:

* every change is a journal entry first; the segments hold what the journal held at
  the last fold. The journal is folded when it holds ``pop_journal_entries_max``
  entries (RabbitMQ's ``queue_index_max_journal_entries``), when the queue has been
  idle for ``pop_journal_idle_fold_ms``, and at a clean stop; then it is emptied;
* a fold writes every changed segment whole (``write_atomically``) and deletes the
  segments whose 16,384 entries are all done (acked, dead-lettered or skipped), except
  the one holding the newest entry, which keeps the cursor;
* recovery reads the segments, replays the journal over them (every entry carries the
  whole new state, so a replay twice is a replay once), cuts a torn journal tail and
  counts damage mid-journal. Damage can only have lost entries, and the only loss that
  would turn an unacknowledged message into a done one is a lost DELIVER: so every
  offset that no surviving entry explains between the folded cursor and the newest
  entry is marked delivered, invisible until now: it is redelivered (at least once).
  A segment file that fails its checks is read as "all delivered" for the same reason.
  State past the queue's end (the log lost its tail to a power cut under ASYNC_FLUSH)
  is dropped: new messages will take those offsets.

``index_set.py`` holds every ``QueueIndex`` of an owner and the heap of invisible times.
The package's docstring (``engine/services/pop/__init__.py``) maps the parts.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.store.pop_files import (
    ACTION_STATE,
    DONE_STATES,
    JOURNAL_ENTRY_BYTES,
    POP_DIR,
    SEGMENT_ENTRY,
    SEGMENT_ENTRY_BYTES,
    SEGMENT_ENTRY_COUNT,
    SEGMENT_STATE_POSITION,
    Action,
    Journal,
    SegmentError,
    State,
    encode_segment,
    pack_entry,
    read_segment,
    segment_numbers,
    segment_path,
    write_segment,
)

log = logging.getLogger(__name__)

PopKey = tuple[str, str, int]  # group, topic, queue id
_ZERO_ENTRY = bytes(JOURNAL_ENTRY_BYTES)


def queue_index_dir(store_dir: Path, group: str, topic: str, queue_id: int) -> Path:
    return store_dir / POP_DIR / group / topic / str(queue_id)


@dataclass
class SegmentCounts:
    open: int  # delivered, not done
    done: int


def _counts(entries: bytearray) -> SegmentCounts:
    states = entries[SEGMENT_STATE_POSITION::SEGMENT_ENTRY_BYTES]
    return SegmentCounts(states.count(State.DELIVERED), sum(states.count(s) for s in DONE_STATES))


@dataclass(eq=False)  # hashed by identity: a set holds the queues written to
class QueueIndex:
    directory: Path
    key: PopKey
    journal: Journal
    segments: dict[int, bytearray] = field(default_factory=dict)
    changed: set[int] = field(default_factory=set)  # segments changed since the last fold
    cursor: int = -1  # -1: the group never popped this queue (it starts at the queue's first message)
    folded_cursor: int = 0
    due: dict[int, None] = field(default_factory=dict)  # offsets to redeliver, oldest first
    dead_lettering: set[int] = field(default_factory=set)  # sent to the DLQ, waiting for the writer
    pending: bytearray = field(default_factory=bytearray)  # journal entries not written yet
    in_flight: int = 0
    dead_lettered: int = 0  # entries DEAD in the loaded segments
    redeliveries: int = 0  # deliveries after the first, since the owner started (a metric)
    last_change_ms: int = 0
    damaged_entries: int = 0  # journal entries found damaged at recovery
    tail_forgotten: bool = False  # recovery dropped state past the queue's end: fold before serving
    incarnation: int = -1  # the topic's deletion offset when this state was made (pop_files.read_incarnation)

    # -- entries ------------------------------------------------------------------------------

    @property
    def invisible(self) -> int:
        """Deliveries in flight and not due yet: while there are any, a FIFO group's queue is locked."""
        return self.in_flight - len(self.due)

    def entry(self, offset: int) -> tuple[int, int, int, int]:
        """(state, attempt, generation, invisible until) of ``offset``; NONE for an unknown one."""
        segment = self.segments.get(offset // SEGMENT_ENTRY_COUNT)
        if segment is None:
            return State.NONE, 0, 0, 0
        until, generation, attempt, state, _ = SEGMENT_ENTRY.unpack_from(
            segment, (offset % SEGMENT_ENTRY_COUNT) * SEGMENT_ENTRY_BYTES)
        return state, attempt, generation, until

    def _segment(self, number: int) -> bytearray:
        segment = self.segments.get(number)
        if segment is None:
            segment = self.segments[number] = bytearray(SEGMENT_ENTRY_COUNT * SEGMENT_ENTRY_BYTES)
        return segment

    def _set(self, offset: int, state: int, attempt: int, generation: int, until: int) -> None:
        number = offset // SEGMENT_ENTRY_COUNT
        SEGMENT_ENTRY.pack_into(self._segment(number), (offset % SEGMENT_ENTRY_COUNT) * SEGMENT_ENTRY_BYTES,
                                until, generation, attempt, state, 0)
        self.changed.add(number)

    def apply(self, offset: int, action: int, attempt: int, generation: int, until: int) -> None:
        """One journal entry's change, in memory (recovery replays entries through here too)."""
        old_state, old_attempt, old_generation, old_until = self.entry(offset)
        if action == Action.CHANGE:
            if old_state != State.DELIVERED:
                return
            self._set(offset, State.DELIVERED, old_attempt, generation, until)
            return
        state = ACTION_STATE[Action(action)]
        if state == State.DELIVERED:
            self._set(offset, state, attempt, generation, until)
        else:
            self._set(offset, state, old_attempt, old_generation, old_until)
        self.in_flight += (state == State.DELIVERED) - (old_state == State.DELIVERED)
        self.dead_lettered += (state == State.DEAD) - (old_state == State.DEAD)
        if offset >= self.cursor:
            self.cursor = offset + 1

    def record(self, offset: int, action: Action, attempt: int = 0, generation: int = 0, until: int = 0) -> None:
        """A change: into memory now, into the journal with the request's other entries (``write``)."""
        pos = len(self.pending)
        self.pending.extend(_ZERO_ENTRY)
        pack_entry(self.pending, pos, offset, action, attempt, generation, until)
        self.apply(offset, action, attempt, generation, until)
        if action not in (Action.DELIVER, Action.CHANGE):
            self.due.pop(offset, None)
            self.dead_lettering.discard(offset)

    def deliver_new(self, offsets: list[int], until: int) -> None:
        """First deliveries (attempt 1, generation 1) of ``offsets``, ascending, all at or past the
        cursor (so none has a state yet): the batch form of ``record(DELIVER)``, for pops."""
        entry = SEGMENT_ENTRY.pack(until, 1, 1, State.DELIVERED, 0)
        start = 0
        while start < len(offsets):  # contiguous runs within one segment: one slice assignment each
            first = offsets[start]
            number, index = divmod(first, SEGMENT_ENTRY_COUNT)
            end = start + 1
            while end < len(offsets) and offsets[end] == first + end - start and \
                    index + end - start < SEGMENT_ENTRY_COUNT:
                end += 1
            segment = self._segment(number)
            segment[index * SEGMENT_ENTRY_BYTES:(index + end - start) * SEGMENT_ENTRY_BYTES] = entry * (end - start)
            self.changed.add(number)
            start = end
        buf = bytearray(JOURNAL_ENTRY_BYTES * len(offsets))
        for i, offset in enumerate(offsets):
            pack_entry(buf, i * JOURNAL_ENTRY_BYTES, offset, Action.DELIVER, 1, 1, until)
        self.pending += buf
        self.in_flight += len(offsets)
        if offsets and offsets[-1] >= self.cursor:
            self.cursor = offsets[-1] + 1

    def ack_many(self, deliveries: list[tuple[int, int]]) -> list[int]:
        """Ack each (offset, generation) whose delivery is current; the indexes of those that are not
        (an ack of an offset already acked with that generation counts as done)."""
        refused = []
        buf = bytearray()
        unpack = SEGMENT_ENTRY.unpack_from
        for i, (offset, generation) in enumerate(deliveries):
            number, index = divmod(offset, SEGMENT_ENTRY_COUNT)
            segment = self.segments.get(number)
            if segment is None:
                refused.append(i)
                continue
            pos = index * SEGMENT_ENTRY_BYTES
            until, current, attempt, state, _ = unpack(segment, pos)
            if current != generation or state not in (State.DELIVERED, State.ACKED):
                refused.append(i)
                continue
            if state == State.ACKED:
                continue
            segment[pos + SEGMENT_STATE_POSITION] = State.ACKED
            self.changed.add(number)
            self.in_flight -= 1
            self.due.pop(offset, None)
            at = len(buf)
            buf.extend(_ZERO_ENTRY)
            pack_entry(buf, at, offset, Action.ACK, attempt, generation, until)
        self.pending += buf
        return refused

    def write(self, now_ms: int) -> None:
        if self.pending:
            self.journal.append(self.pending)
            self.pending = bytearray()
            self.last_change_ms = now_ms

    # -- questions ----------------------------------------------------------------------------

    def redelivered(self) -> int:
        """Entries delivered more than once, in the loaded segments."""
        return sum(1 for segment in self.segments.values()
                   for _until, _generation, attempt, state, _ in SEGMENT_ENTRY.iter_unpack(segment)
                   if attempt > 1 and state != State.NONE)

    def ack_floor(self) -> int:
        """The lowest offset not done: every offset below it is acked, dead-lettered or skipped."""
        if self.cursor < 0:
            return 0
        for number in sorted(self.segments):
            segment = self.segments[number]
            index = segment[SEGMENT_STATE_POSITION::SEGMENT_ENTRY_BYTES].find(State.DELIVERED)
            if index >= 0:
                return min(number * SEGMENT_ENTRY_COUNT + index, self.cursor)
        return self.cursor

    # -- fold ---------------------------------------------------------------------------------

    def fold(self) -> int:
        """Write the journal's changes into the segments, delete the fully done ones, empty the journal.

        Returns the number of segments deleted."""
        assert not self.pending, "write() the pending entries first"
        if self.cursor > 0:
            self._mark_skipped(self.folded_cursor, self.cursor)
        newest = (self.cursor - 1) // SEGMENT_ENTRY_COUNT if self.cursor > 0 else -1
        deleted = 0
        for number in sorted(self.changed):
            segment = self.segments[number]
            counts = _counts(segment)
            if counts.done == SEGMENT_ENTRY_COUNT and number != newest:
                segment_path(self.directory, number).unlink(missing_ok=True)
                del self.segments[number]
                deleted += 1
                continue
            write_segment(self.directory, number,
                          encode_segment(number, segment, open_count=counts.open, done_count=counts.done))
        self.changed.clear()
        self.folded_cursor = max(self.cursor, 0)
        self.journal.empty()
        return deleted

    def _mark_skipped(self, start: int, end: int) -> None:
        """NONE entries in [start, end) were skipped: say so in the segments, and pin the newest."""
        for offset in range(max(start, 0), end):
            segment = self.segments.get(offset // SEGMENT_ENTRY_COUNT)
            if segment is None:
                if offset == end - 1:
                    self._set(offset, State.SKIPPED, 0, 0, 0)
                continue
            if segment[(offset % SEGMENT_ENTRY_COUNT) * SEGMENT_ENTRY_BYTES + SEGMENT_STATE_POSITION] == State.NONE:
                self._set(offset, State.SKIPPED, 0, 0, 0)

    # -- recovery -----------------------------------------------------------------------------

    def recover(self, *, queue_end: int | None) -> None:
        """Segments, then the journal over them (see the module's docstring). ``queue_end``: the
        queue's max offset, past which nothing is delivered (None: not known, no bound)."""
        if queue_end is None:
            queue_end = 1 << 62
        for number in segment_numbers(self.directory):
            try:
                self.segments[number] = read_segment(self.directory, number)
            except (SegmentError, OSError) as exc:
                log.error("pop segment %s is damaged (%s): its messages are redelivered",
                          segment_path(self.directory, number), exc)
                self.segments[number] = self._all_delivered(number, queue_end)
                self.changed.add(number)
        self.cursor = self._newest_recorded() + 1 if self.segments else -1
        self.folded_cursor = max(self.cursor, 0)
        replay = self.journal.read()
        if replay.valid_bytes != os.fstat(self.journal.fd).st_size:
            log.warning("pop journal %s: torn tail cut at byte %d", self.journal.path, replay.valid_bytes)
            self.journal.cut(replay.valid_bytes)
        for entry in replay.entries:
            self.apply(entry.queue_offset, entry.action, entry.attempt, entry.generation, entry.invisible_until_ms)
        self.damaged_entries = replay.damaged_entries
        if self.cursor > queue_end:
            self._forget_from(queue_end)
        if replay.damaged_entries:
            doubtful = self._deliver_unexplained(self.folded_cursor, min(self.cursor, queue_end))
            log.error("pop journal %s: %d damaged entries; %d offsets without a surviving entry are redelivered",
                      self.journal.path, replay.damaged_entries, doubtful)
        self.in_flight = sum(_counts(s).open for s in self.segments.values())
        self.dead_lettered = sum(s[SEGMENT_STATE_POSITION::SEGMENT_ENTRY_BYTES].count(State.DEAD)
                                 for s in self.segments.values())

    def _forget_from(self, end: int) -> None:
        """The queue ends at ``end`` but the state goes further: a power cut took the log's tail
        (ASYNC_FLUSH) after the journal reached the disk. Those offsets will hold new messages:
        their old state goes, so the new ones are delivered. The owner folds at once."""
        log.warning("pop %s: the queue ends at %d but the ack state reaches %d: the state past the end is "
                    "dropped (the log lost its tail)", self.journal.path.parent, end, self.cursor)
        for offset in range(end, self.cursor):
            segment = self.segments.get(offset // SEGMENT_ENTRY_COUNT)
            if segment is not None:
                pos = (offset % SEGMENT_ENTRY_COUNT) * SEGMENT_ENTRY_BYTES
                segment[pos:pos + SEGMENT_ENTRY_BYTES] = bytes(SEGMENT_ENTRY_BYTES)
                self.changed.add(offset // SEGMENT_ENTRY_COUNT)
                self.due.pop(offset, None)
        self.cursor = end if end > 0 else -1
        self.folded_cursor = min(self.folded_cursor, max(end, 0))
        self.tail_forgotten = True

    def _newest_recorded(self) -> int:
        number = max(self.segments)
        states = self.segments[number][SEGMENT_STATE_POSITION::SEGMENT_ENTRY_BYTES]
        index = len(states.rstrip(b"\x00")) - 1
        return number * SEGMENT_ENTRY_COUNT + index if index >= 0 else number * SEGMENT_ENTRY_COUNT - 1

    def _all_delivered(self, number: int, queue_end: int) -> bytearray:
        segment = bytearray(SEGMENT_ENTRY_COUNT * SEGMENT_ENTRY_BYTES)
        first = number * SEGMENT_ENTRY_COUNT
        for index in range(max(0, min(SEGMENT_ENTRY_COUNT, queue_end - first))):
            SEGMENT_ENTRY.pack_into(segment, index * SEGMENT_ENTRY_BYTES, 0, 0, 0, State.DELIVERED, 0)
        return segment

    def _deliver_unexplained(self, start: int, end: int) -> int:
        count = 0
        for offset in range(start, end):
            if self.entry(offset)[0] == State.NONE:
                self._set(offset, State.DELIVERED, 0, 0, 0)  # in memory; the next fold writes it
                count += 1
        return count
