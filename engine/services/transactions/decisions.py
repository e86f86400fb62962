"""The producers' decisions on their transactions (``end_transaction``), and who waits for them.

A decision is taken once: a second ``end_transaction`` with the same decision is answered
with it (once its commit is stored, for a commit still on its way), with the other one
TRANSACTION_ENDED. While a decision's op is being written (``deciding``) a request for the
same decision waits for it; a commit whose op is stored waits until the op is applied
(``waiting``). After an op whose reply was lost, nothing is decided until the op queue has
had the time to show it (``TransactionOps.uncertain``).

Called by the transaction actor (``engine/actors/transactions.py``), which sends the
answers: ``admit`` for each ``end_transaction``; and ``advance_checkpoint`` at each of its
checkpoints.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.errors import ErrorCode, RequestError
from engine.ipc.wire import Origin
from engine.layout import Record
from engine.services.transactions.halves import TransactionHalves
from engine.services.transactions.ops import TransactionOps
from engine.store.transaction_state import TransactionCheckpoint


def advance_checkpoint(checkpoint: TransactionCheckpoint, halves: TransactionHalves, oplog: TransactionOps,
                       flushed: int) -> bool:
    """Into ``checkpoint``, what the flush has passed, so that a power cut never takes what it
    names: the halves read, the ops applied (with their commits) whose halves are among them,
    and every half undecided as far as those ops go. Whether it changed since it was last written
    (the writer then clears ``halves.changed``)."""
    halves.progress(checkpoint, flushed)
    settled = oplog.progress(checkpoint, flushed)
    if settled is not None:
        halves.settled(settled)
        halves.changed = True
    if not halves.changed:
        return False
    checkpoint.halves = halves.undecided_below(checkpoint.halves_read_to)
    return True


@dataclass
class Waiter:
    """A producer's ``end_transaction``, to be answered: its reply frames' head and its id."""

    reply_to: Origin
    request_id: int


@dataclass
class Decision:
    """An end_transaction (or the checks' rollback) whose op is being written."""

    half: Record
    decision: str
    waiters: list[Waiter] = field(default_factory=list)


class Admitted(enum.Enum):
    ANSWER = "answer"  # decided already that way: answer now
    WAITS = "waits"  # the decision is on its way: the waiter is answered with it
    DECIDE = "decide"  # write its op


class TransactionDecisions:
    """The decisions being written and the producers waiting for their commits."""

    def __init__(self, halves: TransactionHalves, oplog: TransactionOps) -> None:
        self.halves = halves
        self.oplog = oplog
        self.deciding: dict[int, Decision] = {}  # half offset -> its op being written
        self.waiting: dict[int, list[Waiter]] = {}  # commits stored: answer these once the op is applied

    def decision_of(self, offset: int) -> str | None:
        return self.oplog.decision_of(offset) or self.halves.decided_early.get(offset)

    def admit(self, half: Record, decision: str, waiter: Waiter, msg_id: str, now_mono_ms: int) -> Admitted:
        """What to do with an ``end_transaction``; RequestError if it cannot be taken."""
        offset = half.commit_log_offset
        known = self.decision_of(offset)
        if known is not None:
            if known != decision:
                raise RequestError(ErrorCode.TRANSACTION_ENDED, f"the transaction of {msg_id} was already "
                                                                f"decided: {known}")
            if offset in self.waiting:
                self.waiting[offset].append(waiter)  # its commit is on its way: answered with it
                return Admitted.WAITS
            return Admitted.ANSWER
        if self.oplog.uncertain.get(offset, 0) > now_mono_ms:
            raise RequestError(ErrorCode.BUSY, f"an earlier decision on {msg_id} got no answer; whether it "
                                               f"was stored is known in a moment: retry")
        if offset in self.deciding:
            if self.deciding[offset].decision != decision:
                raise RequestError(ErrorCode.TRANSACTION_ENDED, f"the transaction of {msg_id} is being "
                                                                f"decided the other way")
            self.deciding[offset].waiters.append(waiter)
            return Admitted.WAITS
        if self.halves.is_decided(offset):
            raise RequestError(ErrorCode.TRANSACTION_ENDED, f"the transaction of {msg_id} was already decided")
        return Admitted.DECIDE

    def remember(self, offset: int, decision: str) -> None:
        """The op deciding the half at ``offset`` is stored (or applied)."""
        self.oplog.remember(offset, decision)
        self.halves.decided(offset, decision)
