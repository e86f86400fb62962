"""Which system-topic records were already moved to their real topic: the restart check of the
timer and the transaction actor (``engine/store/system_topics.py``).

A move is a record in a real topic whose ``ORIGIN_OFFSET`` names the system-topic record
it came from. An actor that restarts, or that lost the reply to a move, reads the log
from the point its checkpoint names (where the uncertain moves began) to the confirmed
end, and moves again only what it does not find: no message is moved twice.

That range may be long (a checkpoint that names a point far back, a log filled by other
topics since), so the look goes a slice at a time (``MoveSearch.step``, at most
``catch_up_bytes_per_turn_max`` of log a call) and the actor's loop sends its heartbeats
between slices. Records are walked by the compiled codec (``codec.scan_dispatch``); only a
record whose bytes hold the property's name is decoded in full.
"""

from __future__ import annotations

import bisect

from engine import codec
from engine.store.commit_log import CommitLogReader, Damage
from engine.store.layout import END_FILE_MIN_BLANK_BYTES, Record, RecordError
from engine.store.system_topics import PROPERTY_ORIGIN_OFFSET, SYSTEM_TOPICS, origin_offset

_MARK = PROPERTY_ORIGIN_OFFSET.encode() + b"\x01"  # a property is name 0x01 value 0x02
_RECORDS_PER_CALL = 4_096  # records one codec call walks (the slice's byte limit is checked between calls)


class MoveSearch:
    """A look through [start, end) of the log for moves, a slice at a time.

    ``found`` is complete once ``done``: the ``ORIGIN_OFFSET`` of every move stored in the range."""

    def __init__(self, reader: CommitLogReader, start: int, end: int) -> None:
        self.reader = reader
        self.start = max(start, reader.min_offset())
        self.position = self.start
        self.end = end
        self.found: set[int] = set()

    @property
    def done(self) -> bool:
        return self.position >= self.end

    def step(self, bytes_max: int) -> None:
        """Look at the next ``bytes_max`` of the range (whole records, at least one)."""
        assert bytes_max > 0
        stop = min(self.end, self.position + bytes_max)
        while self.position < stop:
            segment = self.reader.segment_at(self.position)
            if segment is None:  # retention took it, or the log ends before ``end``: no move there
                self.position = self.end
                return
            base, mm = segment.start_offset, segment.mm
            limit = min(segment.size_bytes, self.end - base)
            pos = self.position - base
            while base + pos < stop:
                if limit - pos < END_FILE_MIN_BLANK_BYTES:
                    pos = segment.size_bytes
                    break
                owners, _index, count, reached, why = codec.scan_dispatch(mm, pos, limit, base, _RECORDS_PER_CALL, 1)
                if count and mm.find(_MARK, pos, reached) >= 0:
                    self._look_closer(owners[0], pos, reached, mm, base)
                pos = reached
                if why == codec.SCAN_BLANK:
                    pos = segment.size_bytes
                    break
                if why == codec.SCAN_DAMAGE:
                    pos = self._step_over(base + pos) - base
            self.position = min(self.end, base + pos)

    def _look_closer(self, entries: list[tuple], pos: int, reached: int, mm, base: int) -> None:
        """Decode the records whose bytes hold the mark (a body may hold it too: the decode says)."""
        starts = [entry[3] for entry in entries]
        hit = mm.find(_MARK, pos, reached)
        while hit >= 0:
            i = bisect.bisect_right(starts, base + hit) - 1
            offset, size = entries[i][3], entries[i][4]
            self._check(offset)
            hit = mm.find(_MARK, offset + size - base, reached)

    def _check(self, offset: int) -> None:
        try:
            record = self.reader.read(offset, limit=self.end, check_crc=False)
        except RecordError:
            return
        self._note(record)

    def _note(self, record: Record) -> None:
        if record.topic not in SYSTEM_TOPICS:
            origin = origin_offset(record)
            if origin is not None:
                self.found.add(origin)

    def _step_over(self, offset: int) -> int:
        """The codec stopped at ``offset``: let the full decoder walk past it (damage, or a record it
        refused)."""
        item = next(iter(self.reader.scan(offset, self.end, check_crc=False)))
        if isinstance(item, Damage):
            return item.end
        self._note(item)
        return item.commit_log_offset + item.total_size


def moved_since(reader: CommitLogReader, start: int, end: int) -> set[int]:
    """The ``ORIGIN_OFFSET`` of every move stored in [start, end) of the log, in one call (tools, tests)."""
    search = MoveSearch(reader, start, end)
    while not search.done:
        search.step(1 << 30)
    return search.found
