"""The op records of transactions (``RMQ_SYS_TRANS_OP_HALF_TOPIC``): read in order, applied in order.

An op (tag ``d``, body the half's queue offset, ``TRAN_DECISION``) is a decision that
stands once it is stored. The first op of a half stands; a later one is void. Ops are
applied in queue order (a commit moves its half to its real topic) and checkpointed,
with their commits, once the flush has passed them. The decisions of the last
``_RECENT_DECISIONS_MAX`` halves are remembered, to answer a repeated ``end_transaction``.

Called by the transaction actor (``engine/actors/transactions.py``): ``read`` with each
pulled batch of ops, ``next_to_apply`` while it applies them, ``remember`` when a
decision's op is stored, and ``progress`` at each checkpoint.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass

from engine.ipc.protocol import MessageView, SendMessage, SendRequest
from engine.layout import Record, RecordError
from engine.services.moved_records import as_send_message
from engine.store.commit_log import CommitLogReader
from engine.store.system_topics import (
    OP_TAG,
    PROPERTY_DECISION,
    PROPERTY_HALF_OFFSET,
    moved_message,
    real_destination,
)
from engine.store.transaction_state import TransactionCheckpoint

log = logging.getLogger(__name__)

_RECENT_DECISIONS_MAX = 100_000  # decisions remembered to answer a repeated end_transaction


@dataclass
class Op:
    """An op record read from the op queue, applied in order."""

    queue_offset: int
    commit_log_offset: int
    half_offset: int
    decision: str
    end: int  # where the op record ends in the log
    applied: bool = False
    move_offset: int = 0  # where its commit was stored


def op_message(half: Record, decision: str) -> SendMessage:
    """The op record that decides ``half``."""
    return SendMessage(body=str(half.queue_offset).encode(), tags=OP_TAG,
                       properties={PROPERTY_DECISION: decision, PROPERTY_HALF_OFFSET: str(half.commit_log_offset)})


def commit_request(reader: CommitLogReader, op: Op, confirmed: int) -> SendRequest | None:
    """The send that moves the half ``op`` commits to its real topic; None if there is nothing to
    move (the half cannot be read, or names no destination)."""
    try:
        half = reader.read(op.half_offset, limit=confirmed)
    except RecordError as exc:
        log.error("the committed half at %d cannot be read (%s): its message is lost", op.half_offset, exc.reason)
        return None
    destination = real_destination(half.properties)
    if destination is None:
        return None
    return SendRequest(op="send", topic=destination[0], queue_id=destination[1],
                       messages=[as_send_message(moved_message(half))], committed_half=op.half_offset)


class TransactionOps:
    """The ops read and not checkpointed, those still to apply, and the decisions they made."""

    def __init__(self) -> None:
        self.ops: deque[Op] = deque()  # read and not checkpointed, in queue order
        self.to_apply: deque[Op] = deque()
        # the first op of each half (its decision and queue offset): it stands, later ones are void
        self.applied: OrderedDict[int, Op] = OrderedDict()
        self.recent: OrderedDict[int, str] = OrderedDict()  # half offset -> its decision
        self.uncertain: dict[int, int] = {}  # half -> until when (mono ms) an op with a lost reply may appear
        # Every op below ``read_to`` in the log has been read (an empty pull of the op queue, sent
        # when its owner had applied the log that far, proves it): while every op read is
        # checkpointed, scan_from may pass the ops' end up to there (``progress``).
        self.pull_applied = 0  # the op queue owner's applied offset when the pull under way was sent
        self.read_to = 0

    def read(self, messages: Iterable[MessageView]) -> None:
        """Ops pulled from the op queue, in order (an empty batch: every op below ``pull_applied`` is read)."""
        empty = True
        for message in messages:
            empty = False
            properties = message.properties
            try:
                half_offset = int(properties.get(PROPERTY_HALF_OFFSET, ""))
            except ValueError:
                continue
            op = Op(message.queue_offset, message.commit_log_offset, half_offset,
                    properties.get(PROPERTY_DECISION, "rollback"), message.commit_log_offset + message.store_size)
            self.ops.append(op)
            self.to_apply.append(op)
        if empty:
            self.read_to = max(self.read_to, self.pull_applied)

    def decision_of(self, offset: int) -> str | None:
        return self.recent.get(offset)

    def remember(self, offset: int, decision: str) -> None:
        self.recent[offset] = decision
        if len(self.recent) > _RECENT_DECISIONS_MAX:
            self.recent.popitem(last=False)

    def first_op(self, op: Op) -> Op:
        """The op that stands for ``op``'s half: ``op`` itself if it is the first (it is now
        recorded as such), else the earlier one (and ``op`` is void: applied as it is)."""
        self.uncertain.pop(op.half_offset, None)
        first = self.applied.get(op.half_offset)
        if first is not None and first is not op:
            op.applied = True
            self.recent[op.half_offset] = first.decision
            return first
        self.applied[op.half_offset] = op
        if len(self.applied) > _RECENT_DECISIONS_MAX:
            self.applied.popitem(last=False)
        return op

    def progress(self, checkpoint: TransactionCheckpoint, flushed: int) -> list[int] | None:
        """Into ``checkpoint``: the ops applied (with their commits) that the flush has passed and
        whose halves are read below ``halves_read_to``; the half offsets of the ops checkpointed,
        or None if the checkpoint did not move."""
        settled: list[int] = []
        moved = False
        while self.ops and self.ops[0].applied and self.ops[0].end <= flushed \
                and self.ops[0].move_offset < flushed and self.ops[0].half_offset < checkpoint.halves_read_to:
            op = self.ops.popleft()
            settled.append(op.half_offset)
            checkpoint.op_next, checkpoint.scan_from = op.queue_offset + 1, op.end
            moved = True
        # No op read and not checkpointed, none unread below read_to: no commit of an op after
        # op_next can lie below it. The next start looks from there, not from the last op (which
        # may be a whole log back), and only as far as the flush has passed (a power cut keeps it).
        passed = min(self.read_to, flushed)
        if not self.ops and passed > checkpoint.scan_from:
            checkpoint.scan_from = passed
            moved = True
        return settled if moved else None
