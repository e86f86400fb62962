"""Delivery and ack logic: pop, ack and change of invisible time over one queue index
(``queue_index.QueueIndex``), called by the owner's pop glue (``engine/actors/owner_pops.py``).

A pop takes the queue's due redeliveries first (oldest first), then new messages from
the pop cursor; each delivery is a journal entry DELIVER with its attempt, its receipt
generation and its invisible time. A receipt handle names the delivery:

    "{queue_id}:{queue_offset}:{generation}:{tag}"

``tag`` is 8 hex digits of crc32("group/topic"), or of "group/topic@D" when the queue's state
belongs to the life of the topic that began when it was deleted at commit log offset D (the
state's ``incarnation``): a handle given with another group or topic, or from before the topic
was deleted and created again, is refused, not taken for the delivery that happens to have the
same numbers (the new life's queues start again at offset 0). A
handle is good until the delivery it names is acked, redelivered or changed (each new
delivery or change has a new generation); acking a good handle twice answers OK twice.

A redelivery whose message is no longer readable (deleted by retention, or no longer
matched by the pop's subscription) is skipped: done without delivery. A delivery that
reached ``max_delivery_attempts`` is not made due again: the owner moves it to the
group's dead-letter queue (``dead_letter``) and records DEAD once the writer stored it.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.errors import ErrorCode, GetStatus
from engine.ipc.protocol import ErrorInfo
from engine.services.owner.pull import PullResult, Subscription
from engine.services.pop.queue_index import QueueIndex
from engine.store.consume_queue import ConsumeQueue
from engine.store.pop_files import Action, State

log = logging.getLogger(__name__)
# (cq, offset, max_messages, max_bytes, subscription) -> what a pull from there finds
QueueRead = Callable[[ConsumeQueue | None, int, int, int, Subscription], PullResult]
_TAGS_CACHED_MAX = 65_536  # (group, topic, incarnation) tags kept: past it the cache starts again
_GONE = (GetStatus.MESSAGE_WAS_REMOVING, GetStatus.OFFSET_TOO_SMALL, GetStatus.NO_MATCHED_MESSAGE)


def handle_tag(group: str, topic: str, incarnation: int = -1) -> str:
    """``incarnation``: the topic's deletion offset when the queue's state was made, -1 for a topic
    never deleted (whose handles keep the tag they had before incarnations were named)."""
    name = f"{group}/{topic}" if incarnation < 0 else f"{group}/{topic}@{incarnation}"
    return f"{zlib.crc32(name.encode()):08x}"


class HandleTags:
    """The receipt handles' tag of each queue index (its group, topic and the topic's life), cached:
    computed once per (group, topic, incarnation), up to ``_TAGS_CACHED_MAX`` (then it starts again)."""

    def __init__(self) -> None:
        self.tags: dict[tuple[str, str, int], str] = {}

    def of(self, queue: QueueIndex) -> str:
        group, topic, _queue_id = queue.key
        tag = self.tags.get((group, topic, queue.incarnation))
        if tag is None:
            if len(self.tags) >= _TAGS_CACHED_MAX:
                self.tags.clear()
            tag = self.tags[(group, topic, queue.incarnation)] = handle_tag(group, topic, queue.incarnation)
        return tag


def encode_handle(queue_id: int, offset: int, generation: int, tag: str) -> str:
    return f"{queue_id}:{offset}:{generation}:{tag}"


def decode_handle(handle: str, queue_id: int, tag: str) -> tuple[int, int] | None:
    """(queue offset, generation) of a handle of this queue and tag; None for any other string."""
    try:
        queue, offset, generation, handle_tag = handle.split(":")
        if handle_tag != tag or int(queue) != queue_id:
            return None
        decoded = int(offset), int(generation)
    except ValueError:  # not four fields, or not numbers
        return None
    return decoded if decoded[0] >= 0 and decoded[1] >= 0 else None


@dataclass
class Taken:
    """What one pop took, over one or more queues."""

    encoded: list[bytes] = field(default_factory=list)
    count: int = 0
    bytes_taken: int = 0
    receipt_handles: list[str] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)

    def add(self, result: PullResult, queue_id: int, tag: str, *, attempt: int = 1, generation: int = 1) -> None:
        """The messages of ``result``, each delivered with ``attempt`` and ``generation`` (a pop's
        first deliveries, or one redelivery)."""
        self.encoded.extend(result.encoded)
        self.count += result.message_count
        self.bytes_taken += sum(len(chunk) for chunk in result.encoded)
        self.receipt_handles.extend([encode_handle(queue_id, offset, generation, tag) for offset in result.offsets])
        self.attempts.extend([attempt] * len(result.offsets))


def take(queue: QueueIndex, cq: ConsumeQueue | None, read: QueueRead, taken: Taken, *, max_messages: int,
         max_bytes: int, subscription: Subscription, until_ms: int, tag: str,
         fifo: bool = False) -> list[tuple[Sequence[int], int]]:
    """Add up to ``max_messages`` deliveries of ``queue`` to ``taken``; what to schedule at
    ``until_ms``, as (offsets, generation) groups.

    ``fifo`` (a group of ``fifo_groups``, RocketMQ's orderly consumption): the queue is locked
    while a delivery of it is invisible; due redeliveries go first, in offset order, and new
    messages only once every earlier one is done. So no message of the queue (and of each message
    group, which keeps to one queue) is delivered before the ones before it are acked."""
    scheduled: list[tuple[Sequence[int], int]] = []
    later: list[int] = []  # due, but not readable now (not visible yet, or past this reply's bytes)
    if fifo:
        if queue.invisible:
            return scheduled  # locked: a delivery is still invisible
        queue.due = dict.fromkeys(sorted(queue.due))  # redeliveries in offset order
    while queue.due and taken.count < max_messages:
        offset = next(iter(queue.due))
        del queue.due[offset]
        state, attempt, generation, _until = queue.entry(offset)
        if state != State.DELIVERED:
            continue
        result = read(cq, offset, 1, max(1, max_bytes - taken.bytes_taken), subscription)
        if result.message_count and result.offsets[0] == offset:
            queue.record(offset, Action.DELIVER, attempt + 1, generation + 1, until_ms)
            queue.redeliveries += 1
            taken.add(result, queue.key[2], tag, attempt=attempt + 1, generation=generation + 1)
            scheduled.append(([offset], generation + 1))
        elif (result.status in _GONE and result.next_offset > offset) or result.corrupt_offset == offset:
            queue.record(offset, Action.SKIP)  # deleted, damaged, or not wanted by this subscription
        else:
            later.append(offset)
    for offset in later:
        queue.due[offset] = None
    if taken.count >= max_messages or cq is None or (fifo and queue.in_flight):
        return scheduled
    if queue.cursor < 0:
        queue.cursor = cq.min_offset
    for _ in range(2):
        result = read(cq, queue.cursor, max_messages - taken.count, max(1, max_bytes - taken.bytes_taken),
                      subscription)
        if result.status == GetStatus.OFFSET_OVERFLOW_BADLY:
            queue.cursor = result.next_offset  # the log lost its tail (an unclean stop): go on from there
            continue
        if result.status == GetStatus.OFFSET_TOO_SMALL:
            queue.cursor = result.next_offset  # retention deleted what the group never took
            continue
        break
    if result.corrupt_offset >= 0 and not result.message_count:
        log.error("pop %s/%s/%d: the message at offset %d is damaged; it is skipped, never served", *queue.key,
                  result.corrupt_offset)
        queue.record(result.corrupt_offset, Action.SKIP)
        return scheduled
    queue.deliver_new(result.offsets, until_ms)
    if result.offsets:
        scheduled.append((_compact(result.offsets), 1))
    if result.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE, GetStatus.MESSAGE_WAS_REMOVING):
        queue.cursor = max(queue.cursor, result.next_offset)
    taken.add(result, queue.key[2], tag)
    return scheduled


def _compact(offsets: list[int]) -> Sequence[int]:
    """A run of consecutive offsets as a range (what the timer heap keeps for a whole pop)."""
    if offsets[-1] - offsets[0] + 1 == len(offsets):
        return range(offsets[0], offsets[-1] + 1)
    return tuple(offsets)


@dataclass
class AckOutcome:
    acked: int = 0
    failed: list[dict[str, str | ErrorInfo]] = field(default_factory=list)


def ack(queue: QueueIndex, handles: list[str], tag: str) -> AckOutcome:
    queue_id = queue.key[2]
    decoded = [decode_handle(handle, queue_id, tag) for handle in handles]
    good = [(i, d) for i, d in enumerate(decoded) if d is not None]
    refused = {good[k][0] for k in queue.ack_many([d for _i, d in good])}
    refused.update(i for i, d in enumerate(decoded) if d is None)
    outcome = AckOutcome(acked=len(handles) - len(refused))
    for i in sorted(refused):
        entry = decoded[i]
        state = queue.entry(entry[0])[0] if entry is not None else State.NONE
        outcome.failed.append({"receipt_handle": handles[i], "error": _stale(handles[i], entry, state)})
    return outcome


def current_deliveries(queue: QueueIndex, handles: list[str], tag: str) -> tuple[list[tuple[int, int]], AckOutcome]:
    """The (offset, generation) of each handle that names its message's current delivery, and the
    outcome counting the others refused, as ``ack`` would (for a dead-letter request)."""
    current: list[tuple[int, int]] = []
    outcome = AckOutcome()
    for handle in handles:
        decoded = decode_handle(handle, queue.key[2], tag)
        state, _attempt, generation, _until = queue.entry(decoded[0]) if decoded is not None else (State.NONE,) * 4
        if decoded is not None and state == State.DELIVERED and generation == decoded[1]:
            current.append(decoded)
            outcome.acked += 1
        else:
            outcome.failed.append({"receipt_handle": handle, "error": _stale(handle, decoded, state)})
    return current, outcome


def _stale(handle: str, decoded: tuple[int, int] | None, state: int) -> ErrorInfo:
    code = ErrorCode.INVALID_RECEIPT_HANDLE
    if decoded is None:
        message = f"{handle!r} is not a receipt handle of this group, topic and queue (or is one from before the " \
            f"topic was deleted and created again)"
    elif state == State.DELIVERED:
        message = "the message was delivered again or its invisible time changed since: use the newest handle"
    elif state == State.NONE:
        message = "no delivery of this message is known"
    else:
        message = f"the message is already {State(state).name.lower()} with another handle"
    return ErrorInfo(int(code), code.name, message)


def change_invisible(queue: QueueIndex, handle: str, tag: str, *, until_ms: int) -> tuple[int, int] | str:
    """The new (offset, generation), or why not."""
    decoded = decode_handle(handle, queue.key[2], tag)
    if decoded is None:
        return f"{handle!r} is not a receipt handle of this group, topic and queue (or is one from before the " \
            f"topic was deleted and created again)"
    offset, generation = decoded
    state, _attempt, current, _until = queue.entry(offset)
    if state != State.DELIVERED or current != generation:
        return "the handle is stale: the message was acked, delivered again or changed since"
    queue.record(offset, Action.CHANGE, 0, generation + 1, until_ms)
    queue.due.pop(offset, None)
    return offset, generation + 1
