"""The undecided half messages and RocketMQ's check service over them.

Every half read from ``RMQ_SYS_TRANS_HALF_TOPIC`` and not decided yet is kept here with
when it is next checked. A half older than ``transaction_timeout_ms`` is offered to its
producer group's ``transaction_checks`` every ``transaction_check_interval_ms``; after
``transaction_check_max`` offers it is to be rolled back (``due_checks``), as RocketMQ's
``TransactionalMessageCheckService`` does. A half decided before it was read is remembered
until it is, so that it is never offered.

Called by the transaction actor (``engine/actors/transactions.py``): ``read`` with each
pulled batch of halves, ``decided`` when a decision's op is stored or applied,
``due_checks`` every tick, ``take_offered`` for a ``transaction_checks`` request, and
``progress`` at each checkpoint.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Container, Iterable

import msgspec

from engine.config import StoreConfig
from engine.errors import ErrorCode, RequestError
from engine.ipc.protocol import MessageView
from engine.layout import Record, RecordError, decode_msg_id
from engine.store.commit_log import CommitLogReader
from engine.store.system_topics import HALF_TOPIC, PROPERTY_PRODUCER_GROUP, real_destination
from engine.store.transaction_state import Half, TransactionCheckpoint

log = logging.getLogger(__name__)


class CheckView(MessageView, kw_only=True):
    """A half offered to a check (protocol section 4.19): its message, named by its real topic
    and queue, and how often it was offered."""

    check_times: int


def read_half(reader: CommitLogReader, msg_id: str, producer_group: str | None, confirmed: int) -> Record:
    """The half message ``msg_id`` names (of ``producer_group``, if given); RequestError if it names none."""
    try:
        _host, offset = decode_msg_id(msg_id)
    except ValueError as exc:
        raise RequestError(ErrorCode.INVALID_MSG_ID, f"not a message id: {exc}") from None
    if offset < 0:  # checked here: the log's reads assert their offsets are not negative
        raise RequestError(ErrorCode.TRANSACTION_NOT_FOUND, f"{msg_id} names a negative commit log offset")
    try:
        record = reader.read(offset, limit=confirmed)
    except RecordError:
        record = None
    if record is None or record.topic != HALF_TOPIC:
        raise RequestError(ErrorCode.TRANSACTION_NOT_FOUND, f"{msg_id} is not a half message of this store")
    if producer_group is not None and record.properties.get(PROPERTY_PRODUCER_GROUP) != producer_group:
        raise RequestError(ErrorCode.TRANSACTION_NOT_FOUND, f"{msg_id} is not a half message of producer group "
                                                            f"{producer_group!r}")
    return record


class TransactionHalves:
    """The undecided halves, their check schedule, and the halves offered to each producer group."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.halves: dict[int, Half] = {}  # commit-log offset -> the undecided half
        self.check_heap: list[tuple[int, int]] = []  # (next check wall ms, half offset), lazily pruned
        self.next_check: dict[int, int] = {}
        self.decided_early: dict[int, str] = {}  # decided before their half was read
        self.decided_since: dict[int, Half] = {}  # decided by an op the checkpoint does not cover yet
        self.half_marks: deque[tuple[int, int]] = deque()  # (end of a half read, the half queue's next offset)
        self.read_to = 0  # commit-log end of the last half read
        self.offered: dict[str, dict[int, None]] = {}  # producer group -> halves due for a check, in order
        self.checks_offered = 0
        self.changed = True  # since the last checkpoint

    def __len__(self) -> int:
        return len(self.halves)

    def recover(self, checkpoint: TransactionCheckpoint, now: int) -> None:
        for half in checkpoint.halves:
            self.keep(half, now)
        self.read_to = checkpoint.halves_read_to

    def keep(self, half: Half, now: int) -> None:
        self.halves[half.commit_log_offset] = half
        due = max(half.store_ms + self.config.transaction_timeout_ms, now if half.checks else 0)
        self.next_check[half.commit_log_offset] = due
        heapq.heappush(self.check_heap, (due, half.commit_log_offset))

    def read(self, messages: Iterable[MessageView], now: int, recent: Container[int]) -> None:
        """Halves pulled from the half queue, in order; those decided already (``recent``) are not kept."""
        for message in messages:
            offset = message.commit_log_offset
            self.read_to = offset + message.store_size
            self.half_marks.append((self.read_to, message.queue_offset + 1))
            if self.decided_early.pop(offset, None) is not None or offset in recent:
                continue
            group = message.properties.get(PROPERTY_PRODUCER_GROUP, "")
            if len(self.halves) >= self.config.transaction_halves_max:
                log.error("more than transaction_halves_max undecided halves: the half at %d is rolled back", offset)
                self.rollback_later(offset)
                continue
            self.keep(Half(offset, message.queue_offset, message.store_timestamp, group), now)
        self.changed = True

    def rollback_later(self, offset: int) -> None:
        self.next_check[offset] = 0
        heapq.heappush(self.check_heap, (0, offset))

    def decided(self, offset: int, decision: str) -> None:
        """The half at ``offset`` is decided: no longer checked."""
        half = self.halves.pop(offset, None)
        if half is not None:
            self.decided_since[offset] = half  # undecided as far as the checkpoint goes, until its op is
            self.changed = True
        elif offset >= self.read_to:
            self.decided_early[offset] = decision  # its half is read later: it is not offered to checks
            self.changed = True

    def is_decided(self, offset: int) -> bool:
        """Read, and no longer undecided."""
        return offset < self.read_to and offset not in self.halves

    def due_checks(self, now: int, deciding: Container[int]) -> list[int]:
        """Offer every half whose check is due to its group; the halves to roll back (checked
        ``transaction_check_max`` times, or never kept past ``transaction_halves_max``)."""
        rollbacks = []
        while self.check_heap and self.check_heap[0][0] <= now:
            due, offset = heapq.heappop(self.check_heap)
            if self.next_check.get(offset) != due:
                continue  # decided, or rescheduled
            if due == 0 and offset not in deciding:  # past transaction_halves_max: never kept
                self.next_check.pop(offset, None)
                rollbacks.append(offset)
                continue
            half = self.halves.get(offset)
            if half is None or offset in deciding:
                self.next_check.pop(offset, None)
                continue
            if half.checks >= self.config.transaction_check_max:
                self.next_check.pop(offset, None)
                rollbacks.append(offset)
                continue
            half.checks += 1
            self.checks_offered += 1
            self.changed = True
            self.offered.setdefault(half.producer_group, {})[offset] = None  # once, however often checked
            again = now + self.config.transaction_check_interval_ms
            self.next_check[offset] = again
            heapq.heappush(self.check_heap, (again, offset))
        return rollbacks

    def take_offered(self, group: str, count: int, reader: CommitLogReader, confirmed: int) -> list[CheckView]:
        """Up to ``count`` halves offered to ``group`` and still undecided, each offered once."""
        queue, views = self.offered.get(group), list[CheckView]()
        while queue and len(views) < count:
            offset = next(iter(queue))
            del queue[offset]
            half = self.halves.get(offset)
            if half is None:
                continue  # decided since it was offered
            try:
                view = reader.read_view(offset, limit=confirmed)
            except RecordError:
                continue
            destination = real_destination(view["properties"])  # the view has them decoded already
            if destination is not None:
                view["topic"], view["queue_id"] = destination
            view["check_times"] = half.checks
            views.append(msgspec.convert(view, CheckView))
        return views

    def progress(self, checkpoint: TransactionCheckpoint, flushed: int) -> None:
        """Into ``checkpoint``: how far the halves read are past the flush."""
        while self.half_marks and self.half_marks[0][0] <= flushed:
            checkpoint.halves_read_to, checkpoint.half_next = self.half_marks.popleft()
            self.changed = True

    def settled(self, offsets: Iterable[int]) -> None:
        """The ops deciding these halves are checkpointed: the checkpoint no longer names them."""
        for offset in offsets:
            self.decided_since.pop(offset, None)
            self.changed = True

    def undecided_below(self, end: int) -> list[Half]:
        """The halves the checkpoint names: read below ``end`` and undecided as far as its ops go."""
        return [half for half in (*self.halves.values(), *self.decided_since.values())
                if half.commit_log_offset < end]
