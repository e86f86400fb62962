"""The transaction actor: decides half messages and runs RocketMQ's check service.

A transactional send is stored as a half message in ``RMQ_SYS_TRANS_HALF_TOPIC``
(``engine/services/delivery_routes.py``), invisible to consumers. This actor, a client of
the front on its internal port and served by it on ``transactions.sock``:

* ``end_transaction``: appends an op record (``RMQ_SYS_TRANS_OP_HALF_TOPIC``, tag ``d``,
  body the half's queue offset, ``TRAN_DECISION``); once it is stored the decision stands;
* follows the op queue and applies each op in order: a commit moves the half to its real
  topic (``send`` with ``ORIGIN_OFFSET``); the producer's ``end_transaction`` is answered
  once its commit is stored (a rollback once its op is);
* follows the half queue and keeps the undecided halves; a half older than
  ``transaction_timeout_ms`` is offered to its producer group's ``transaction_checks``
  every ``transaction_check_interval_ms``, and after ``transaction_check_max`` offers it is
  rolled back (RocketMQ's ``TransactionalMessageCheckService``);
* checkpoints ``config/transactions.json`` (``engine/store/transaction_state.py``).

Exactly once across a crash: ops before the checkpoint's ``op_next`` are applied; after a
restart the actor waits until any commit still in the writer's queue is stored or refused,
reads the log from the first unapplied op for commits already stored, and applies the
rest. A decision is never taken twice: a second ``end_transaction`` with the same
decision is answered OK, with the other one TRANSACTION_ENDED.
"""

from __future__ import annotations

import heapq
import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.actors.base import Actor, Env, Handler, Port, main
from engine.actors.effects import Effects
from engine.actors.front_requests import FrontRequests, QueueFollower, Reply, front_port
from engine.errors import ErrorCode, RequestError
from engine.ipc import channels
from engine.ipc.channels import Channel, ClientFrame
from engine.ipc.messages import EndTransaction, TransactionChecks
from engine.ipc.protocol import (
    EndTransactionRequest,
    TransactionChecksRequest,
    decode_request,
    encode_error,
    encode_reply,
    safe_request_id,
)
from engine.ipc.wire import Inbound, Origin
from engine.layout import Record, RecordError, decode_msg_id
from engine.services.moved_records import MoveSearch
from engine.store.commit_log import CommitLogReader
from engine.store.disk_refusals import DiskRefusals
from engine.store.records import owner_of
from engine.store.shared_offsets import CONFIRMED, FLUSHED, HALVES_PENDING, owner_slot
from engine.store.system_topics import (
    HALF_TOPIC,
    OP_HALF_TOPIC,
    OP_TAG,
    PROPERTY_DECISION,
    PROPERTY_HALF_OFFSET,
    PROPERTY_PRODUCER_GROUP,
    moved_message,
    real_destination,
)
from engine.store.transaction_state import (
    Half,
    TransactionCheckpoint,
    load_transaction_checkpoint,
    store_transaction_checkpoint,
)

log = logging.getLogger(__name__)

_REQUEST_TIMEOUT_MS = 5_000
_RECENT_DECISIONS_MAX = 100_000  # decisions remembered to answer a repeated end_transaction
_RETRY = {ErrorCode.BUSY, ErrorCode.SERVICE_NOT_AVAILABLE, ErrorCode.DISK_FULL, ErrorCode.TIMEOUT}


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


@dataclass
class Waiter:
    reply_to: Origin
    request_id: int


@dataclass
class ParkedChecks:
    reply_to: Origin
    request: TransactionChecksRequest
    deadline_ms: int


@dataclass
class Decision:
    """An end_transaction (or the checks' rollback) whose op is being written."""

    half: Record
    decision: str
    waiters: list[Waiter] = field(default_factory=list)


class TransactionActor(Actor):
    """Takes ``EndTransaction`` and ``TransactionChecks`` on ``requests``, replies on ``front``;
    gives client replies on ``requests`` and op records and commits (``send``) on ``front``."""

    tick_interval_ms = 20

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.reader = CommitLogReader.for_config(env.store_dir, env.config)
        self.front = FrontRequests(env.clock)
        self.checkpoint = TransactionCheckpoint()
        self.halves: dict[int, Half] = {}
        self.check_heap: list[tuple[int, int]] = []  # (next check wall ms, half offset), lazily pruned
        self.next_check: dict[int, int] = {}
        self.decided: dict[int, str] = {}  # decided before their half was read
        self.decided_since: dict[int, Half] = {}  # decided by an op the checkpoint does not cover yet
        self.half_marks: deque[tuple[int, int]] = deque()  # (end of a half read, the half queue's next offset)
        self.recent: OrderedDict[int, str] = OrderedDict()
        # the first op of each half (its decision and queue offset): it stands, later ones are void
        self.applied: OrderedDict[int, Op] = OrderedDict()
        self.uncertain: dict[int, int] = {}  # half -> until when (mono ms) an op with a lost reply may appear
        self.deciding: dict[int, Decision] = {}
        self.waiting: dict[int, list[Waiter]] = {}  # commits stored: answer these once the op is applied
        self.ops: deque[Op] = deque()  # read and not checkpointed, in queue order
        self.to_apply: deque[Op] = deque()
        self.half_follower = QueueFollower(self.front, HALF_TOPIC, 0)
        self.op_follower = QueueFollower(self.front, OP_HALF_TOPIC, 0)
        self.halves_read_to = 0  # commit-log end of the last half read
        self.offered: dict[str, dict[int, None]] = {}  # producer group -> halves due for a check, in order
        self.parked: list[ParkedChecks] = []
        self.already_moved: set[int] = set()
        self.look_at_ms = 0
        self.look_pending = True
        self.look: MoveSearch | None = None  # the look for moves under way, a slice a turn
        # Every op below ``ops_read_to`` in the log has been read (an empty pull of the op queue, sent
        # when its owner had applied the log that far, proves it): while every op read is
        # checkpointed, scan_from may pass the ops' end up to there (``store_checkpoint``).
        self.op_owner_slot = owner_slot(owner_of(OP_HALF_TOPIC, 0, env.config.consume_queue_owner_count))
        self.op_pull_applied = 0
        self.ops_read_to = 0
        self.last_checkpoint_ms = 0
        self.disk = DiskRefusals("transactions")  # a full disk: the checkpoint waits, checks go on
        self.changed = True
        self.committed = self.rolled_back = self.checks_offered = 0

    def ports(self) -> list[Port]:
        return [front_port(), Port(channels.TRANSACTIONS, bind=True)]

    def recover(self, out: Effects) -> None:
        checkpoint = load_transaction_checkpoint(self.env.store_dir)
        self.checkpoint = checkpoint
        self.half_follower.next_offset, self.op_follower.next_offset = checkpoint.half_next, checkpoint.op_next
        now = self.clock.wall_ms()
        for half in checkpoint.halves:
            self.keep_half(half, now)
        self.halves_read_to = checkpoint.halves_read_to
        self.look_at_ms = self.clock.mono_ms() + self.config.send_queue_wait_ms_max + 200
        log.info("recovered: %d undecided halves; reading halves from %d and ops from %d", len(self.halves),
                 checkpoint.half_next, checkpoint.op_next)

    # -- requests from producers -------------------------------------------------------------

    def handlers(self) -> dict[type, Handler]:
        return {EndTransaction: self.answering(self.end_transaction),
                TransactionChecks: self.answering(self.transaction_checks), ClientFrame: self.on_front_reply}

    def answering(self, serve: Callable[[Origin, bytes, Effects], None]) -> Handler:
        """A producer's request: a RequestError is its error reply; then the work it may have made."""

        def handler(_order: object, inbound: Inbound, out: Effects) -> None:
            assert inbound.origin is not None
            try:
                serve(inbound.origin, inbound.payload, out)
            except RequestError as exc:
                out.reply(inbound.origin, encode_error(safe_request_id(inbound.payload), exc.code, exc.message))
            self.work(out)
        return handler

    def on_front_reply(self, _frame: ClientFrame, inbound: Inbound, out: Effects) -> None:
        self.front.handle_reply(inbound.payload, out)
        self.work(out)

    def end_transaction(self, reply_to: Origin, raw: bytes, out: Effects) -> None:
        request = decode_request("end_transaction", raw)
        assert isinstance(request, EndTransactionRequest)
        half = self.read_half(request.msg_id, request.producer_group)
        offset = half.commit_log_offset
        waiter = Waiter(reply_to, request.id)
        known = self.decision_of(offset)
        if known is not None:
            if known != request.decision:
                raise RequestError(ErrorCode.TRANSACTION_ENDED, f"the transaction of {request.msg_id} was already "
                                                                f"decided: {known}")
            if offset in self.waiting:
                self.waiting[offset].append(waiter)  # its commit is on its way: answered with it
            else:
                out.reply(reply_to, encode_reply(request.id, decision=known))
            return
        if self.uncertain.get(offset, 0) > self.clock.mono_ms():
            raise RequestError(ErrorCode.BUSY, f"an earlier decision on {request.msg_id} got no answer; whether it "
                                               f"was stored is known in a moment: retry")
        if offset in self.deciding:
            if self.deciding[offset].decision != request.decision:
                raise RequestError(ErrorCode.TRANSACTION_ENDED, f"the transaction of {request.msg_id} is being "
                                                                f"decided the other way")
            self.deciding[offset].waiters.append(waiter)
            return
        if offset < self.halves_read_to and offset not in self.halves:
            raise RequestError(ErrorCode.TRANSACTION_ENDED, f"the transaction of {request.msg_id} was already decided")
        self.decide(half, request.decision, [waiter], out)

    def read_half(self, msg_id: str, producer_group: str | None) -> Record:
        try:
            _host, offset = decode_msg_id(msg_id)
        except ValueError as exc:
            raise RequestError(ErrorCode.INVALID_MSG_ID, f"not a message id: {exc}") from None
        if offset < 0:  # checked here: the log's reads assert their offsets are not negative
            raise RequestError(ErrorCode.TRANSACTION_NOT_FOUND, f"{msg_id} names a negative commit log offset")
        try:
            record = self.reader.read(offset, limit=self.slots.get(CONFIRMED))
        except RecordError:
            record = None
        if record is None or record.topic != HALF_TOPIC:
            raise RequestError(ErrorCode.TRANSACTION_NOT_FOUND, f"{msg_id} is not a half message of this store")
        if producer_group is not None and record.properties.get(PROPERTY_PRODUCER_GROUP) != producer_group:
            raise RequestError(ErrorCode.TRANSACTION_NOT_FOUND, f"{msg_id} is not a half message of producer group "
                                                                f"{producer_group!r}")
        return record

    def decision_of(self, offset: int) -> str | None:
        return self.recent.get(offset) or self.decided.get(offset)

    def decide(self, half: Record, decision: str, waiters: list[Waiter], out: Effects) -> None:
        """Write the op record; the decision stands once it is stored."""
        offset = half.commit_log_offset
        self.deciding[offset] = Decision(half, decision, waiters)
        op = {"body": str(half.queue_offset).encode(), "tags": OP_TAG,
              "properties": {PROPERTY_DECISION: decision, PROPERTY_HALF_OFFSET: str(offset)}}

        def on_reply(reply: Reply, later: Effects) -> None:
            pending = self.deciding.pop(offset)
            if reply is not None and reply.get("ok"):
                first = self.applied.get(offset)
                if first is not None and first.decision != decision:  # an earlier op (its answer lost) stands
                    for waiter in pending.waiters:
                        later.reply(waiter.reply_to, encode_error(
                            waiter.request_id, ErrorCode.TRANSACTION_ENDED, f"already decided: {first.decision}"))
                    return
                self.remember(offset, decision)
                if decision == "commit":  # answered once the op is applied (its message stored)
                    self.waiting.setdefault(offset, []).extend(pending.waiters)
                else:
                    for waiter in pending.waiters:
                        later.reply(waiter.reply_to, encode_reply(waiter.request_id, decision=decision))
                return
            code, message = (ErrorCode(reply["error"]["code"]), reply["error"]["message"]) if reply is not None \
                else (ErrorCode.TIMEOUT, "the op record got no answer in time")
            if reply is None:  # stored or not: the op queue tells within this time
                self.uncertain[offset] = self.clock.mono_ms() + self.config.send_queue_wait_ms_max + 3_000
            for waiter in pending.waiters:  # not decided (or, if the op was stored after all, the op queue says so)
                later.reply(waiter.reply_to, encode_error(waiter.request_id, code,
                                                          f"the decision was not stored: {message}"))

        self.front.send(out, "send", on_reply, timeout_ms=_REQUEST_TIMEOUT_MS, topic=OP_HALF_TOPIC, queue_id=0,
                        messages=[op])

    def remember(self, offset: int, decision: str) -> None:
        self.recent[offset] = decision
        if len(self.recent) > _RECENT_DECISIONS_MAX:
            self.recent.popitem(last=False)
        half = self.halves.pop(offset, None)
        if half is not None:
            self.decided_since[offset] = half  # undecided as far as the checkpoint goes, until its op is
            self.changed = True
        elif offset >= self.halves_read_to:
            self.decided[offset] = decision  # its half is read later: it is not offered to checks
            self.changed = True

    def transaction_checks(self, reply_to: Origin, raw: bytes, out: Effects) -> None:
        request = decode_request("transaction_checks", raw)
        assert isinstance(request, TransactionChecksRequest)
        views = self.take_offered(request.producer_group, request.max_messages)
        if views or request.max_wait_ms == 0:
            out.reply(reply_to, encode_reply(request.id, checks=views))
            return
        wait = min(request.max_wait_ms, self.config.long_poll_wait_ms_max)
        self.parked.append(ParkedChecks(reply_to, request, self.clock.mono_ms() + wait))

    def take_offered(self, group: str, count: int) -> list[dict[str, Any]]:
        queue, views = self.offered.get(group), list[dict[str, Any]]()
        confirmed = self.slots.get(CONFIRMED)
        while queue and len(views) < count:
            offset = next(iter(queue))
            del queue[offset]
            half = self.halves.get(offset)
            if half is None:
                continue  # decided since it was offered
            try:
                view = self.reader.read_view(offset, limit=confirmed)
            except RecordError:
                continue
            destination = real_destination(view["properties"])  # the view has them decoded already
            if destination is not None:
                view["topic"], view["queue_id"] = destination
            view["check_times"] = half.checks
            views.append(view)
        return views

    # -- following the queues ----------------------------------------------------------------

    def on_halves(self, messages: list[dict[str, Any]], out: Effects) -> None:
        now = self.clock.wall_ms()
        for message in messages:
            offset = message["commit_log_offset"]
            self.halves_read_to = offset + message["store_size"]
            self.half_marks.append((self.halves_read_to, message["queue_offset"] + 1))
            if self.decided.pop(offset, None) is not None or offset in self.recent:
                continue
            group = message["properties"].get(PROPERTY_PRODUCER_GROUP, "")
            if len(self.halves) >= self.config.transaction_halves_max:
                log.error("more than transaction_halves_max undecided halves: the half at %d is rolled back", offset)
                self.rollback_later(offset)
                continue
            self.keep_half(Half(offset, message["queue_offset"], message["store_timestamp"], group), now)
        self.changed = True

    def keep_half(self, half: Half, now: int) -> None:
        self.halves[half.commit_log_offset] = half
        due = max(half.store_ms + self.config.transaction_timeout_ms, now if half.checks else 0)
        self.next_check[half.commit_log_offset] = due
        heapq.heappush(self.check_heap, (due, half.commit_log_offset))

    def rollback_later(self, offset: int) -> None:
        self.next_check[offset] = 0
        heapq.heappush(self.check_heap, (0, offset))

    def on_ops(self, messages: list[dict[str, Any]], out: Effects) -> None:
        if not messages:
            self.ops_read_to = max(self.ops_read_to, self.op_pull_applied)
        for message in messages:
            properties = message["properties"]
            try:
                half_offset = int(properties.get(PROPERTY_HALF_OFFSET, ""))
            except ValueError:
                continue
            op = Op(message["queue_offset"], message["commit_log_offset"], half_offset,
                    properties.get(PROPERTY_DECISION, "rollback"), message["commit_log_offset"] + message["store_size"])
            self.ops.append(op)
            self.to_apply.append(op)

    def apply_ops(self, out: Effects) -> None:
        """Apply the ops in order: a commit moves its half (unless the log shows it moved already)."""
        while self.to_apply:
            op = self.to_apply.popleft()
            self.uncertain.pop(op.half_offset, None)
            first = self.applied.get(op.half_offset)
            if first is not None and first is not op:  # a later op of a decided half: void
                op.applied = True
                self.recent[op.half_offset] = first.decision
                if first.applied or first.decision != "commit":  # else answered when the first commit is
                    self.answer_waiting(op.half_offset, first.decision, out)
                continue
            self.applied[op.half_offset] = op
            if len(self.applied) > _RECENT_DECISIONS_MAX:
                self.applied.popitem(last=False)
            self.remember(op.half_offset, op.decision)
            if op.decision != "commit":
                op.applied = True
                self.rolled_back += 1
                continue
            if op.half_offset in self.already_moved:
                self.already_moved.discard(op.half_offset)
                self.finish_commit(op, out)
                continue
            self.move(op, out)

    def move(self, op: Op, out: Effects) -> None:
        confirmed = self.slots.get(CONFIRMED)
        try:
            half = self.reader.read(op.half_offset, limit=confirmed)
        except RecordError as exc:
            log.error("the committed half at %d cannot be read (%s): its message is lost", op.half_offset, exc.reason)
            self.finish_commit(op, out)
            return
        destination = real_destination(half.properties)
        if destination is None:
            self.finish_commit(op, out)
            return
        op.move_offset = -1  # in flight

        def on_reply(reply: Reply, later: Effects) -> None:
            if reply is not None and reply.get("ok"):
                op.move_offset = max(result.get("commit_log_offset", 0) for result in reply["results"])
                self.finish_commit(op, later)
                return
            code = reply["error"]["code"] if reply is not None else None
            if code is not None and code not in _RETRY:
                log.error("the commit of the half at %d cannot be stored: %s", op.half_offset,
                          reply["error"]["message"] if reply else "")
                self.finish_commit(op, later)
                return
            op.move_offset = 0  # tried again; after a lost reply, only once the log was looked at
            self.to_apply.append(op)
            if code is None or code == ErrorCode.TIMEOUT:
                self.look_pending = True
                self.look = None  # a look under way ends before this move: look again, to the end
                self.look_at_ms = self.clock.mono_ms() + self.config.send_queue_wait_ms_max + 200

        self.front.send(out, "send", on_reply, timeout_ms=_REQUEST_TIMEOUT_MS, topic=destination[0],
                        queue_id=destination[1], messages=[moved_message(half)], committed_half=op.half_offset)

    def finish_commit(self, op: Op, out: Effects) -> None:
        op.applied = True
        self.committed += 1
        self.answer_waiting(op.half_offset, "commit", out)

    def answer_waiting(self, offset: int, decision: str, out: Effects) -> None:
        """The producers waiting for the commit of ``offset``: done, or the half went the other way."""
        for waiter in self.waiting.pop(offset, []):
            reply = encode_reply(waiter.request_id, decision="commit") if decision == "commit" else encode_error(
                waiter.request_id, ErrorCode.TRANSACTION_ENDED, f"the half message at {offset} was rolled back")
            out.reply(waiter.reply_to, reply)

    # -- checks ------------------------------------------------------------------------------

    def run_checks(self, out: Effects) -> None:
        now = self.clock.wall_ms()
        while self.check_heap and self.check_heap[0][0] <= now:
            due, offset = heapq.heappop(self.check_heap)
            if self.next_check.get(offset) != due:
                continue  # decided, or rescheduled
            if due == 0 and offset not in self.deciding:  # past transaction_halves_max: never kept
                self.next_check.pop(offset, None)
                self.rollback_unanswered(offset, out)
                continue
            half = self.halves.get(offset)
            if half is None or offset in self.deciding:
                self.next_check.pop(offset, None)
                continue
            if half.checks >= self.config.transaction_check_max:
                self.next_check.pop(offset, None)
                self.rollback_unanswered(offset, out)
                continue
            half.checks += 1
            self.checks_offered += 1
            self.changed = True
            self.offered.setdefault(half.producer_group, {})[offset] = None  # once, however often checked
            again = now + self.config.transaction_check_interval_ms
            self.next_check[offset] = again
            heapq.heappush(self.check_heap, (again, offset))
        self.answer_parked(out)

    def rollback_unanswered(self, offset: int, out: Effects) -> None:
        try:
            half = self.reader.read(offset, limit=self.slots.get(CONFIRMED))
        except RecordError:
            self.halves.pop(offset, None)
            return
        log.warning("the half message at %d was checked %d times without a decision: rolled back", offset,
                    self.config.transaction_check_max)
        self.decide(half, "rollback", [], out)

    def answer_parked(self, out: Effects) -> None:
        now, kept = self.clock.mono_ms(), []
        for parked in self.parked:
            views = self.take_offered(parked.request.producer_group, parked.request.max_messages)
            if views or parked.deadline_ms <= now:
                out.reply(parked.reply_to, encode_reply(parked.request.id, checks=views))
            else:
                kept.append(parked)
        self.parked = kept

    # -- the loop ----------------------------------------------------------------------------

    def work(self, out: Effects) -> None:
        self.half_follower.pull(out, self.on_halves)
        if not self.op_follower.pulling:  # the pull sent now finds every op below this, or names it
            self.op_pull_applied = self.slots.get(self.op_owner_slot)
        self.op_follower.pull(out, self.on_ops)
        if self.clock.mono_ms() < self.look_at_ms:
            return
        if self.look_pending and not self.look_for_moves():
            return  # the next turn goes on with it
        self.apply_ops(out)

    def look_for_moves(self) -> bool:
        """One slice of the look for commits already stored (after a start or a lost reply); True
        once it is done. No op is applied before: its commit may be among them."""
        if self.look is None:
            start = self.ops[0].commit_log_offset if self.ops else self.checkpoint.scan_from
            self.look = MoveSearch(self.reader, min(start, self.checkpoint.scan_from), self.slots.get(CONFIRMED))
        self.look.step(self.config.catch_up_bytes_per_turn_max)
        if not self.look.done:
            return False
        self.already_moved |= self.look.found
        self.look, self.look_pending = None, False
        return True

    def backlog(self) -> bool:
        return self.look is not None

    def work_backlog(self, out: Effects) -> None:
        self.work(out)

    def connection(self, channel: Channel, up: bool) -> None:
        if not up:
            self.front.lost()  # handed back at the next tick, their outcome unknown

    def tick(self, out: Effects) -> None:
        self.front.expire(out)
        self.work(out)
        self.run_checks(out)
        now = self.clock.mono_ms()
        if now - self.last_checkpoint_ms >= 1_000:
            self.last_checkpoint_ms = now
            try:
                self.store_checkpoint()
            except OSError as exc:  # a full disk: it stays changed, and the next second retries
                self.disk.refused(exc)
            else:
                self.disk.written()

    def store_checkpoint(self) -> None:
        """What the flush has passed, so that a power cut never takes what the checkpoint names: the
        halves read, the ops applied (with their commits) whose halves are among them, and every half
        undecided as far as those ops go."""
        flushed = self.slots.get(FLUSHED)
        checkpoint = self.checkpoint
        while self.half_marks and self.half_marks[0][0] <= flushed:
            checkpoint.halves_read_to, checkpoint.half_next = self.half_marks.popleft()
            self.changed = True
        while self.ops and self.ops[0].applied and self.ops[0].end <= flushed \
                and self.ops[0].move_offset < flushed and self.ops[0].half_offset < checkpoint.halves_read_to:
            op = self.ops.popleft()
            self.decided_since.pop(op.half_offset, None)
            checkpoint.op_next, checkpoint.scan_from = op.queue_offset + 1, op.end
            self.changed = True
        # No op read and not checkpointed, none unread below ops_read_to: no commit of an op after
        # op_next can lie below it. The next start looks from there, not from the last op (which
        # may be a whole log back), and only as far as the flush has passed (a power cut keeps it).
        passed = min(self.ops_read_to, flushed)
        if not self.ops and passed > checkpoint.scan_from:
            checkpoint.scan_from = passed
            self.changed = True
        if not self.changed:
            return
        checkpoint.halves = [half for half in (*self.halves.values(), *self.decided_since.values())
                             if half.commit_log_offset < checkpoint.halves_read_to]
        store_transaction_checkpoint(self.env.store_dir, checkpoint)
        self.changed = False
        self.slots.set(HALVES_PENDING, len(self.halves))

    def detail(self) -> dict[str, int]:
        return {"halves": len(self.halves), "committed": self.committed, "rolled_back": self.rolled_back,
                "checks_offered": self.checks_offered, "op_next": self.checkpoint.op_next,
                "disk_refusals": self.disk.count, "scan_from": self.checkpoint.scan_from}

    def condition(self) -> str:
        return self.disk.condition()

    def shutdown(self, out: Effects) -> None:
        self.changed = True
        self.store_checkpoint()


if __name__ == "__main__":
    raise SystemExit(main(TransactionActor))
