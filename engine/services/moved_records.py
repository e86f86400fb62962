"""Which system-topic records were already moved to their real topic: the restart check of the
timer and the transaction actor (``engine/store/system_topics.py``).

A move is a record in a real topic whose ``ORIGIN_OFFSET`` names the system-topic record
it came from. An actor that restarts, or that lost the reply to a move, reads the log
from the point its checkpoint names (where the uncertain moves began) to the confirmed
end, and moves again only what it does not find: no message is moved twice.

That range may be long (a checkpoint that names a point far back, a log filled by other
topics since), so the look goes a slice at a time (``MoveSearch.step``, at most
``catch_up_bytes_per_turn_max`` of log a call) and the actor's loop sends its heartbeats
between slices. Most of the log holds no move: a search for the property's name passes it
without parsing a record. Around a hit the records are walked by the compiled codec
(``log_slices.read_slice``), and only a record whose bytes hold the name is decoded in full.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Mapping

import msgspec

from engine.codec_py import DispatchTuple
from engine.errors import ErrorCode
from engine.ipc.protocol import SendMessage, SendReply
from engine.layout import RecordError
from engine.services.log_slices import read_slice
from engine.store.commit_log import CommitLogReader
from engine.store.system_topics import PROPERTY_ORIGIN_OFFSET, SYSTEM_TOPICS, origin_offset

_MARK = PROPERTY_ORIGIN_OFFSET.encode() + b"\x01"  # a property is name 0x01 value 0x02
# Refusals after which nothing was stored: the move is tried again. Any other refusal is
# final for that message (its topic or queue is gone).
_RETRY = {ErrorCode.BUSY, ErrorCode.SERVICE_NOT_AVAILABLE, ErrorCode.DISK_FULL, ErrorCode.SLAVE_NOT_AVAILABLE}


class MoveOutcome(enum.Enum):
    """What the front's reply to a move (a ``send`` with ``ORIGIN_OFFSET``) says became of it."""

    STORED = "stored"
    REFUSED = "refused"  # for good: counted and logged, never tried again
    RETRY = "retry"  # not stored: try again
    UNKNOWN = "unknown"  # no reply, or TIMEOUT: stored or not, the log tells (a look) before a retry


def move_outcome(reply: SendReply | None) -> MoveOutcome:
    if reply is not None and reply.ok:
        return MoveOutcome.STORED
    if reply is None or reply.error is None or reply.error.code == ErrorCode.TIMEOUT:
        return MoveOutcome.UNKNOWN
    return MoveOutcome.RETRY if reply.error.code in _RETRY else MoveOutcome.REFUSED


def as_send_message(message: Mapping[str, object]) -> SendMessage:
    """A move's message (``system_topics.moved_message`` or ``moved_view_message``) as the send's struct."""
    return msgspec.convert(message, SendMessage)


def refusal(reply: SendReply | None) -> str:
    """The refusal's message, for the log."""
    return reply.error.message if reply is not None and reply.error is not None else "no reply in time"


class MoveSearch:
    """A look through [start, end) of the log for moves, a slice at a time.

    ``found`` is complete once ``done``: the ``ORIGIN_OFFSET`` of every move stored in the range."""

    def __init__(self, reader: CommitLogReader, start: int, end: int) -> None:
        self.reader = reader
        self.start = max(start, reader.min_offset())
        self.position = self.start  # a record boundary: every move before it is in ``found``
        self.clean_to = self.start  # the name appears nowhere in [position, clean_to)
        self.end = end
        self.found: set[int] = set()

    @property
    def done(self) -> bool:
        return self.position >= self.end

    def step(self, bytes_max: int) -> None:
        """Look at the next ``bytes_max`` of the range.

        Bytes where the property's name does not appear are passed without parsing a record: a
        search for it runs ahead of ``position`` (``clean_to``), and a segment found clean to its
        end is left at once (the next one starts at a record). Up to a hit, the records are walked
        (``read_slice``) and the ones that hold it decoded."""
        segment = self.reader.segment_at(self.position)
        if segment is None:  # retention took it, or the log ends before ``end``: no move there
            self.position = self.end
            return
        base = segment.start_offset
        segment_end = min(segment.end_offset, self.end)
        self.clean_to = max(self.clean_to, self.position)
        window_end = min(segment_end, self.clean_to + max(bytes_max, 2 * len(_MARK)))
        if segment.mm.find(_MARK, self.clean_to - base, window_end - base) < 0:
            if window_end >= segment_end:
                self.position = self.clean_to = segment_end
            else:  # a name across the window's end is found by the next search
                self.clean_to = window_end - len(_MARK) + 1
            return
        piece = read_slice(self.reader, self.position, self.end, bytes_max, 1)
        if piece.per_owner[0]:
            self._look_closer(piece.per_owner[0])
        self.position = self.clean_to = piece.end

    def _look_closer(self, entries: list[DispatchTuple]) -> None:
        """Decode the records whose bytes hold the mark (a body may hold it too: the decode says)."""
        starts = [entry[3] for entry in entries]
        offset, last_end = starts[0], entries[-1][3] + entries[-1][4]
        while offset < last_end:
            segment = self.reader.segment_at(offset)
            if segment is None:
                return
            base = segment.start_offset
            hi = min(last_end, segment.end_offset) - base
            hit = segment.mm.find(_MARK, offset - base, hi)
            while hit >= 0:
                i = bisect.bisect_right(starts, base + hit) - 1
                self._check(entries[i][3])
                hit = segment.mm.find(_MARK, entries[i][3] + entries[i][4] - base, hi)
            offset = segment.end_offset

    def _check(self, offset: int) -> None:
        try:
            record = self.reader.read(offset, limit=self.end, check_crc=False)
        except RecordError:
            return
        if record.topic not in SYSTEM_TOPICS:
            origin = origin_offset(record)
            if origin is not None:
                self.found.add(origin)


def moved_since(reader: CommitLogReader, start: int, end: int) -> set[int]:
    """The ``ORIGIN_OFFSET`` of every move stored in [start, end) of the log, in one call (tools, tests)."""
    search = MoveSearch(reader, start, end)
    while not search.done:
        search.step(1 << 30)
    return search.found


class MoveLook:
    """When to look for moves already stored, and what the last look found: after a start, and
    after a move whose reply was lost (it may be stored), nothing is moved before a look from
    ``start`` to the confirmed end is done; what it found is never moved again. For the
    transaction actor (the timer, which also tracks where its looks began, keeps its own)."""

    def __init__(self, reader: CommitLogReader) -> None:
        self.reader = reader
        self.found: set[int] = set()  # system-topic offsets moved already
        self.at_ms = 0  # mono ms from when to look: once any move still in the writer's queue is settled
        self.pending = True
        self.search: MoveSearch | None = None  # the look under way, a slice a turn

    def after(self, at_ms: int) -> None:
        """A move's outcome is unknown: look again, to the end, from ``at_ms`` on."""
        self.pending = True
        self.search = None  # a look under way ends before this move
        self.at_ms = at_ms

    def done(self, now_mono_ms: int, start: int, confirmed: int, step_bytes: int) -> bool:
        """Whether no look is due or under way; else one slice of it (``step_bytes`` of log)."""
        if now_mono_ms < self.at_ms:
            return False
        if not self.pending:
            return True
        if self.search is None:
            self.search = MoveSearch(self.reader, start, confirmed)
        self.search.step(step_bytes)
        if not self.search.done:
            return False
        self.found |= self.search.found
        self.search, self.pending = None, False
        return True

    def take(self, offset: int) -> bool:
        """Whether the record at ``offset`` was found moved (and is then forgotten)."""
        if offset in self.found:
            self.found.discard(offset)
            return True
        return False
