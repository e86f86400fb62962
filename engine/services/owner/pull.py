"""Serving a pull from one ConsumeQueue, with RocketMQ's statuses (DefaultMessageStore#getMessage).

| condition                     | status                 | next offset              |
|-------------------------------|------------------------|--------------------------|
| no queue file yet, or empty   | NO_MESSAGE_IN_QUEUE    | 0                        |
| offset < min                  | OFFSET_TOO_SMALL       | min                      |
| offset == max                 | OFFSET_OVERFLOW_ONE    | offset                   |
| offset > max                  | OFFSET_OVERFLOW_BADLY  | max                      |
| units read, none kept         | NO_MATCHED_MESSAGE /   | past the scanned units   |
|                               | MESSAGE_WAS_REMOVING   |                          |
| at least one kept             | FOUND                  | last kept offset + 1     |

(Unknown topics and queue ids never reach this module: the front refuses
them with TOPIC_NOT_FOUND / QUEUE_NOT_FOUND, as RocketMQ's broker does before
asking its store.)

Every record read is checked against its unit (topic, queue, queue offset,
size): a unit that leads elsewhere is reported as ``suspect_offset`` so the
owner can rebuild it from the log and try again.

A record that fails its CRC check, or a hole a damaged record left in the
queue, is never served nor silently skipped: the pull stops before it, and a
pull that starts on it is refused with MESSAGE_CORRUPT, naming the next
offset so a consumer can decide to skip it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from engine import codec
from engine.errors import GetStatus
from engine.layout import CQ_UNIT, CQ_UNIT_BYTES, RecordError
from engine.store.commit_log import CommitLogReader
from engine.store.consume_queue import ConsumeQueue, Unit


@dataclass
class PullResult:
    status: GetStatus
    next_offset: int
    min_offset: int
    max_offset: int
    encoded: list[bytes] = field(default_factory=list)  # msgpack message maps (codec.read_view's), in order
    built: list[Any] = field(default_factory=list)  # or, with a Build, the messages as the reader's objects
    message_count: int = 0
    offsets: list[int] = field(default_factory=list)  # the queue offset of each message, in order
    corrupt_offset: int = -1  # queue offset of a damaged record met first
    suspect_offset: int = -1  # queue offset of the first unit that did not lead to its own record

    def messages(self) -> msgspec.Raw:
        """The messages as the reply's msgpack array, ready to embed."""
        return message_array(self.encoded, self.message_count)


def message_array(encoded: list[bytes], count: int) -> msgspec.Raw:
    """``count`` msgpack message maps, encoded back to back in ``encoded``, as one msgpack array."""
    return msgspec.Raw(_array_header(count) + b"".join(encoded))


def _array_header(count: int) -> bytes:
    if count < 16:
        return bytes([0x90 | count])
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


class Subscription:
    """``*`` or ``tagA || tagB``: matched first by the units' tags codes, then by the tag itself."""

    def __init__(self, expression: str) -> None:
        tags = {t.strip() for t in expression.split("||")} - {""}
        self.everything = not tags or "*" in tags
        self.tags = frozenset(tags)
        self.codes = frozenset(codec.tags_code(t) for t in tags)

    def matches_code(self, code: int) -> bool:
        return self.everything or code in self.codes

    def matches_tag(self, tag: str | None) -> bool:
        return self.everything or tag in self.tags


EVERYTHING = Subscription("*")
_encoder = msgspec.msgpack.Encoder()


@dataclass(frozen=True)
class Build:
    """A reader in the store's own process builds its messages straight from the records
    (``codec.pull_objects``): ``factory(**fields)``, the fields of ``codec.read_view``'s dict,
    ``keys`` a tuple with ``tuple_keys`` (``rmqpy.Message``), else a list (``MessageView``)."""
    factory: Callable[..., Any]
    tuple_keys: bool

    def one(self, view: dict[str, Any]) -> Any:
        if self.tuple_keys:
            view["keys"] = tuple(view["keys"])
        return self.factory(**view)


def pull(cq: ConsumeQueue | None, reader: CommitLogReader, *, offset: int, max_messages: int, max_bytes: int,
         visible_end: int, written_end: int | None = None, subscription: Subscription = EVERYTHING,
         build: Build | None = None) -> PullResult:
    """Read up to ``max_messages`` / ``max_bytes`` from ``offset``, never past ``visible_end``: the
    messages encoded (``encoded``), or with ``build`` built as the reader's objects (``built``).

    A unit past ``written_end`` (the writer's confirmed offset) cannot be real:
    it is reported as suspect. One between the two is not visible yet (SYNC_FLUSH
    waits for the flush): the pull stops there.
    """
    written_end = visible_end if written_end is None else written_end
    if cq is None:
        return PullResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
    lo, hi = cq.min_offset, cq.max_offset
    if hi == 0:
        return PullResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, lo, hi)
    if offset < lo:
        return PullResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, hi)
    if offset == hi:
        return PullResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi)
    if offset > hi:
        return PullResult(GetStatus.OFFSET_OVERFLOW_BADLY, hi, lo, hi)
    result = PullResult(GetStatus.NO_MATCHED_MESSAGE, offset, lo, hi)
    log_min = reader.min_offset()
    filtered = not subscription.everything
    taken_bytes = 0
    removed = 0
    units, units_pos, count = cq.unit_span(offset, max_messages)
    i = 0
    while i < count:
        queue_offset = offset + i
        unit = Unit(*CQ_UNIT.unpack_from(units, units_pos + i * CQ_UNIT_BYTES))
        if not filtered and unit.is_plausible:
            # The plain run: every unit whose record is intact, in one segment and visible.
            segment = reader.segment_at(unit.commit_log_offset)
            if segment is not None:
                run = (units, units_pos + i * CQ_UNIT_BYTES, count - i, segment.mm, segment.start_offset,
                       visible_end, log_min, cq.topic, cq.queue_id, queue_offset, max_bytes, taken_bytes,
                       reader.require_record_crc)
                if build is None:
                    maps, served, taken_bytes = codec.pull_run(*run)
                else:
                    built, served, taken_bytes = codec.pull_objects(build.factory, build.tuple_keys, *run)
                if served:
                    if build is None:
                        result.encoded.append(maps)
                    else:
                        result.built += built
                    result.message_count += served
                    result.offsets.extend(range(queue_offset, queue_offset + served))
                    i += served
                    result.next_offset = offset + i
                    continue
        # Every other unit, one at a time.
        if unit.is_blank:
            # A hole left by a damaged record: never skipped silently.
            if not result.message_count:
                result.corrupt_offset = queue_offset
                result.next_offset = queue_offset + 1
            break
        if not unit.is_plausible:
            result.suspect_offset = queue_offset
            break
        if unit.commit_log_offset + unit.size > visible_end:
            if unit.commit_log_offset + unit.size > written_end:
                result.suspect_offset = queue_offset  # units exist only for dispatched records
            break
        i += 1
        if unit.commit_log_offset < log_min:
            removed += 1
            result.next_offset = queue_offset + 1
            continue
        if filtered and not subscription.matches_code(unit.tags_code):
            result.next_offset = queue_offset + 1
            continue
        if result.message_count and taken_bytes + unit.size > max_bytes:
            break
        try:
            view = reader.read_view(unit.commit_log_offset, limit=visible_end)
        except RecordError:
            if unit.commit_log_offset < reader.min_offset():  # its segment was deleted just now
                removed += 1
                result.next_offset = queue_offset + 1
                continue
            result.suspect_offset = queue_offset
            break
        if (view["topic"], view["queue_id"], view["queue_offset"], view["store_size"]) != \
                (cq.topic, cq.queue_id, queue_offset, unit.size):
            result.suspect_offset = queue_offset  # a damaged unit: it points at another record
            break
        if filtered and not subscription.matches_tag(view["tags"]):
            result.next_offset = queue_offset + 1  # the tags codes collided (Java hashCode): not ours
            continue
        if build is None:
            result.encoded.append(_encoder.encode(view))
        else:
            result.built.append(build.one(view))
        result.message_count += 1
        result.offsets.append(queue_offset)
        taken_bytes += unit.size
        result.next_offset = queue_offset + 1
    if result.message_count:
        result.status = GetStatus.FOUND
    elif removed:
        result.status = GetStatus.MESSAGE_WAS_REMOVING
    return result
