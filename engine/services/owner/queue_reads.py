"""The reads a ConsumeQueue owner serves from its queues and the log: pulls (at once, or
parked until a message arrives), reads of one record by id or by offset, and the queue
questions (``queue_stats``, ``offset_for_time``).

A pull reads the queue from its offset up to the readable end (``engine/services/owner/pull.py``);
a unit that leads elsewhere in the log is healed once (``OwnedQueues.heal``) and read
again, and a message that is still damaged is MESSAGE_CORRUPT with the offset to go on
from. A pull that finds nothing new (or nothing its subscription matches) and may wait
is parked (``engine/services/owner/long_poll.py``) and served again when a dispatch touches
its queue or its deadline passes; ``final`` answers it with what there is.

Called by the owner (``engine/actors/consume_queue_owner.py``) for each ``Pull``,
``GetById``, ``GetByOffset``, ``QueueStats`` and ``OffsetForTime``, and for the pulls it
wakes; the owner's pops (``engine/actors/owner_pops.py``) read through ``read_queue``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import msgspec

from engine.codec_py import MessageMap
from engine.config import StoreConfig
from engine.errors import ErrorCode, GetStatus, RequestError
from engine.ipc.protocol import (
    GetByIdRequest,
    GetByOffsetRequest,
    OffsetForTimeRequest,
    PullRequest,
    QueueStatsRequest,
    decode_as,
    encode_reply,
)
from engine.ipc.wire import Origin
from engine.layout import RecordError, decode_msg_id
from engine.services.owner.long_poll import LongPolls
from engine.services.owner.owned_queues import OwnedQueues, QueueKey
from engine.services.owner.pull import PullResult, Subscription, pull
from engine.services.owner.queue_queries import offset_for_time, queue_stats
from engine.store.commit_log import CommitLogReader
from engine.store.consume_queue import ConsumeQueue
from engine.store.deleted_topics import DeletedTopics
from engine.store.shared_offsets import CONFIRMED, SharedOffsets

_SUBSCRIPTIONS_CACHED_MAX = 1024
NOTHING_YET = (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE)  # a long poll may wait


def msg_id_offset(msg_id: str) -> int:
    """The commit log offset a message id names; RequestError INVALID_MSG_ID if it is none."""
    try:
        _host, offset = decode_msg_id(msg_id)
    except ValueError as exc:
        raise RequestError(ErrorCode.INVALID_MSG_ID, f"{msg_id!r} is not a message id: {exc}") from None
    return offset


def read_record(reader: CommitLogReader, deleted_topics: DeletedTopics, offset: int, *,
                visible_end: int) -> tuple[MessageMap, bool]:
    """The record at ``offset`` below ``visible_end``, and whether it is of a deleted topic's earlier
    life (its queue offset names no message of the topic now); RequestError MESSAGE_NOT_FOUND, or
    MESSAGE_CORRUPT for a damaged record. What ``get_by_id`` and ``get_by_offset`` answer, in the
    owner and in ``engine/local_reads.py``."""
    if not reader.min_offset() <= offset < visible_end:
        raise RequestError(ErrorCode.MESSAGE_NOT_FOUND, f"no message at commit log offset {offset}")
    try:
        view = reader.read_view(offset, limit=visible_end)
    except RecordError as exc:
        code = ErrorCode.MESSAGE_CORRUPT if exc.damaged else ErrorCode.MESSAGE_NOT_FOUND
        raise RequestError(code, f"no intact message at commit log offset {offset}: {exc.reason}") from None
    return view, deleted_topics.hides(view["topic"], offset)


class QueueReads:
    """The owner's reads; ``mono_ms`` is its clock (the simulation's, under simulation)."""

    def __init__(self, owned: OwnedQueues, slots: SharedOffsets, config: StoreConfig, long_polls: LongPolls, *,
                 mono_ms: Callable[[], int], sync_flush: bool) -> None:
        self.owned = owned
        self.reader = owned.reader
        self.slots = slots
        self.config = config
        self.long_polls = long_polls
        self.mono_ms = mono_ms
        self.sync_flush = sync_flush
        self.subscriptions: dict[str, Subscription] = {}  # parsed, up to _SUBSCRIPTIONS_CACHED_MAX
        self.pulled_messages: dict[QueueKey, int] = {}  # since this process started, for metrics
        self.pulled_bytes: dict[QueueKey, int] = {}

    @property
    def visible_end(self) -> int:
        return self.slots.visible_end(sync_flush=self.sync_flush, sync_replication=self.config.reads_wait_for_replicas)

    def subscription(self, expression: str) -> Subscription:
        cached = self.subscriptions.get(expression)
        if cached is None:
            if len(self.subscriptions) > _SUBSCRIPTIONS_CACHED_MAX:
                self.subscriptions.clear()
            cached = self.subscriptions[expression] = Subscription(expression)
        return cached

    def read_queue(self, cq: ConsumeQueue | None, offset: int, max_messages: int, max_bytes: int,
                   subscription: Subscription) -> PullResult:
        """What a pull from ``offset`` finds, after healing a unit that leads elsewhere."""
        visible_end, written_end = self.visible_end, self.slots.get(CONFIRMED)

        def pull_now() -> PullResult:
            return pull(cq, self.reader, offset=offset, visible_end=visible_end, subscription=subscription,
                        written_end=written_end, max_messages=max_messages, max_bytes=max_bytes)

        result = pull_now()
        if result.suspect_offset >= 0 and cq is not None and \
                self.owned.heal(cq, result.suspect_offset, visible_end=visible_end):
            result = pull_now()
        if result.suspect_offset >= 0 and not result.message_count:
            result.corrupt_offset = result.suspect_offset
            result.next_offset = result.suspect_offset + 1
        return result

    def pull(self, request: PullRequest, *, reply_to: Origin | None = None, final: bool = False,
             deadline_ms: int | None = None) -> bytes | None:
        """Serve a pull; None when it was parked to wait for a new message (long polling)."""
        cq = self.owned.get(request.topic, request.queue_id)
        max_messages = min(request.max_messages, self.config.pull_message_count_max)
        max_bytes = min(request.max_bytes, self.config.pull_bytes_max)
        result = self.read_queue(cq, request.offset, max_messages, max_bytes, self.subscription(request.subscription))
        if result.corrupt_offset >= 0:
            raise RequestError(ErrorCode.MESSAGE_CORRUPT,
                               f"the message at queue offset {result.corrupt_offset} is damaged (it failed its "
                               f"checks, or the log lost it) and is not served; the next offset is "
                               f"{result.next_offset}", next_offset=result.next_offset,
                               min_offset=result.min_offset, max_offset=result.max_offset)
        if result.message_count:
            key = (request.topic, request.queue_id)
            self.pulled_messages[key] = self.pulled_messages.get(key, 0) + result.message_count
            self.pulled_bytes[key] = self.pulled_bytes.get(key, 0) + sum(map(len, result.encoded))
        nothing_yet = result.status in NOTHING_YET or (
            result.status == GetStatus.NO_MATCHED_MESSAGE and cq is not None and result.next_offset >= cq.max_offset)
        if not final and nothing_yet and request.max_wait_ms > 0 and reply_to is not None:
            waiting = msgspec.structs.replace(request, offset=max(request.offset, result.next_offset))
            if self.long_polls.park(reply_to, waiting, now_ms=self.mono_ms(), deadline_ms=deadline_ms):
                return None  # answered when a (matching) message arrives, or at the deadline
        return encode_reply(request.id, status=result.status.name, status_code=int(result.status),
                            next_offset=result.next_offset, min_offset=result.min_offset,
                            max_offset=result.max_offset, messages=result.messages())

    def queue_question(self, kind: type[QueueStatsRequest | OffsetForTimeRequest], raw: bytes) -> bytes:
        """``queue_stats`` or ``offset_for_time`` of one queue (``engine/services/owner/queue_queries.py``)."""
        request = decode_as(kind, raw)
        cq = self.owned.get(request.topic, request.queue_id)
        if isinstance(request, QueueStatsRequest):
            stats = queue_stats(cq, self.reader, visible_end=self.visible_end)
            return encode_reply(request.id, **dataclasses.asdict(stats))
        offset = offset_for_time(cq, self.reader, timestamp_ms=request.timestamp, upper=request.boundary == "upper",
                                 visible_end=self.visible_end)
        return encode_reply(request.id, offset=offset)

    def get_by_id(self, raw: bytes, *, by_offset: bool = False) -> bytes:
        """The record a message id (or, ``by_offset``, a commit log offset) names, below the readable end."""
        request: GetByOffsetRequest | GetByIdRequest
        if by_offset:
            request = decode_as(GetByOffsetRequest, raw)
            offset = request.commit_log_offset
        else:
            request = decode_as(GetByIdRequest, raw)
            offset = msg_id_offset(request.msg_id)
        view, deleted = read_record(self.reader, self.owned.deleted_topics, offset, visible_end=self.visible_end)
        if deleted:
            return encode_reply(request.id, message=view, deleted_topic=True)
        return encode_reply(request.id, message=view)
