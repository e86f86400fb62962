"""The transaction actor: decides half messages and runs RocketMQ's check service.

A transactional send is stored as a half message in ``RMQ_SYS_TRANS_HALF_TOPIC``
(``engine/services/writer/delivery_routes.py``), invisible to consumers. This actor, a client of
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

The jobs are plain objects: the undecided halves and their checks in
``engine/services/transactions/halves.py``, the ops and their decisions in
``engine/services/transactions/ops.py``; this actor holds the requests (of producers, and
to the front) and the checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from engine.actors.base import Actor, Env, Handler, Port, main
from engine.actors.effects import Effects
from engine.actors.front_requests import FrontRequests, QueueFollower, front_port
from engine.errors import ErrorCode, RequestError
from engine.ipc import channels
from engine.ipc.channels import Channel, ClientFrame
from engine.ipc.messages import EndTransaction, TransactionChecks
from engine.ipc.protocol import (
    EndTransactionRequest,
    MessageView,
    SendReply,
    SendRequest,
    TransactionChecksRequest,
    decode_request,
    encode_error,
    encode_reply,
    safe_request_id,
)
from engine.ipc.wire import Inbound, Origin
from engine.layout import Record, RecordError
from engine.services.moved_records import MoveLook, MoveOutcome, move_outcome, refusal
from engine.services.transactions.decisions import Admitted, Decision, TransactionDecisions, Waiter, advance_checkpoint
from engine.services.transactions.halves import TransactionHalves, read_half
from engine.services.transactions.ops import Op, TransactionOps, commit_request, op_message
from engine.store.commit_log import CommitLogReader
from engine.store.disk_refusals import DiskRefusals
from engine.store.records import owner_of
from engine.store.shared_offsets import CONFIRMED, FLUSHED, HALVES_PENDING, owner_slot
from engine.store.system_topics import HALF_TOPIC, OP_HALF_TOPIC
from engine.store.transaction_state import (
    TransactionCheckpoint,
    load_transaction_checkpoint,
    store_transaction_checkpoint,
)

log = logging.getLogger(__name__)

_REQUEST_TIMEOUT_MS = 5_000


@dataclass
class ParkedChecks:
    reply_to: Origin
    request: TransactionChecksRequest
    deadline_ms: int


class TransactionActor(Actor):
    """Takes ``EndTransaction`` and ``TransactionChecks`` on ``requests``, replies on ``front``;
    gives client replies on ``requests`` and op records and commits (``send``) on ``front``."""

    tick_interval_ms = 20

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.reader = CommitLogReader.for_config(env.store_dir, env.config)
        self.front = FrontRequests(env.clock)
        self.checkpoint = TransactionCheckpoint()
        self.halves = TransactionHalves(env.config)
        self.oplog = TransactionOps()
        self.decisions = TransactionDecisions(self.halves, self.oplog)
        self.half_follower = QueueFollower(self.front, HALF_TOPIC, 0)
        self.op_follower = QueueFollower(self.front, OP_HALF_TOPIC, 0)
        self.parked: list[ParkedChecks] = []
        self.look = MoveLook(self.reader)  # for commits already stored, after a start or a lost reply
        self.op_owner_slot = owner_slot(owner_of(OP_HALF_TOPIC, 0, env.config.consume_queue_owner_count))
        self.last_checkpoint_ms = 0
        self.disk = DiskRefusals("transactions")  # a full disk: the checkpoint waits, checks go on
        self.committed = self.rolled_back = 0

    def ports(self) -> list[Port]:
        return [front_port(), Port(channels.TRANSACTIONS, bind=True)]

    def recover(self, out: Effects) -> None:
        checkpoint = load_transaction_checkpoint(self.env.store_dir)
        self.checkpoint = checkpoint
        self.half_follower.next_offset, self.op_follower.next_offset = checkpoint.half_next, checkpoint.op_next
        self.halves.recover(checkpoint, self.clock.wall_ms())
        self.look.at_ms = self.look_wait_end()
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
        half = read_half(self.reader, request.msg_id, request.producer_group, self.slots.get(CONFIRMED))
        offset = half.commit_log_offset
        waiter = Waiter(reply_to, request.id)
        match self.decisions.admit(half, request.decision, waiter, request.msg_id, self.clock.mono_ms()):
            case Admitted.ANSWER:
                known = self.decisions.decision_of(offset)
                out.reply(reply_to, encode_reply(request.id, decision=known))
            case Admitted.DECIDE:
                self.decide(half, request.decision, [waiter], out)

    def decide(self, half: Record, decision: str, waiters: list[Waiter], out: Effects) -> None:
        """Write the op record; the decision stands once it is stored."""
        offset = half.commit_log_offset
        self.decisions.deciding[offset] = Decision(half, decision, waiters)

        def on_reply(reply: SendReply | None, later: Effects) -> None:
            pending = self.decisions.deciding.pop(offset)
            if reply is not None and reply.ok:
                first = self.oplog.applied.get(offset)
                if first is not None and first.decision != decision:  # an earlier op (its answer lost) stands
                    for waiter in pending.waiters:
                        later.reply(waiter.reply_to, encode_error(
                            waiter.request_id, ErrorCode.TRANSACTION_ENDED, f"already decided: {first.decision}"))
                    return
                self.decisions.remember(offset, decision)
                if decision == "commit":  # answered once the op is applied (its message stored)
                    self.decisions.waiting.setdefault(offset, []).extend(pending.waiters)
                else:
                    for waiter in pending.waiters:
                        later.reply(waiter.reply_to, encode_reply(waiter.request_id, decision=decision))
                return
            code, message = (ErrorCode(reply.error.code), reply.error.message) \
                if reply is not None and reply.error is not None \
                else (ErrorCode.TIMEOUT, "the op record got no answer in time")
            if reply is None:  # stored or not: the op queue tells within this time
                self.oplog.uncertain[offset] = self.clock.mono_ms() + self.config.send_queue_wait_ms_max + 3_000
            for waiter in pending.waiters:  # not decided (or, if the op was stored after all, the op queue says so)
                later.reply(waiter.reply_to, encode_error(waiter.request_id, code,
                                                          f"the decision was not stored: {message}"))

        self.front.send(out, SendRequest(op="send", topic=OP_HALF_TOPIC, queue_id=0,
                                         messages=[op_message(half, decision)]),
                        on_reply, timeout_ms=_REQUEST_TIMEOUT_MS)

    def transaction_checks(self, reply_to: Origin, raw: bytes, out: Effects) -> None:
        request = decode_request("transaction_checks", raw)
        assert isinstance(request, TransactionChecksRequest)
        views = self.halves.take_offered(request.producer_group, request.max_messages, self.reader,
                                         self.slots.get(CONFIRMED))
        if views or request.max_wait_ms == 0:
            out.reply(reply_to, encode_reply(request.id, checks=views))
            return
        wait = min(request.max_wait_ms, self.config.long_poll_wait_ms_max)
        self.parked.append(ParkedChecks(reply_to, request, self.clock.mono_ms() + wait))

    # -- following the queues ----------------------------------------------------------------

    def on_halves(self, messages: list[MessageView], out: Effects) -> None:
        self.halves.read(messages, self.clock.wall_ms(), self.oplog.recent)

    def apply_ops(self, out: Effects) -> None:
        """Apply the ops in order: a commit moves its half (unless the log shows it moved already)."""
        while self.oplog.to_apply:
            op = self.oplog.to_apply.popleft()
            first = self.oplog.first_op(op)
            if first is not op:  # a later op of a decided half: void
                if first.applied or first.decision != "commit":  # else answered when the first commit is
                    self.answer_waiting(op.half_offset, first.decision, out)
                continue
            self.decisions.remember(op.half_offset, op.decision)
            if op.decision != "commit":
                op.applied = True
                self.rolled_back += 1
                continue
            if self.look.take(op.half_offset):
                self.finish_commit(op, out)
                continue
            self.move(op, out)

    def move(self, op: Op, out: Effects) -> None:
        commit = commit_request(self.reader, op, self.slots.get(CONFIRMED))
        if commit is None:  # nothing to move
            self.finish_commit(op, out)
            return
        op.move_offset = -1  # in flight

        def on_reply(reply: SendReply | None, later: Effects) -> None:
            outcome = move_outcome(reply)
            if outcome is MoveOutcome.STORED:
                assert reply is not None
                op.move_offset = max(result.commit_log_offset for result in reply.results)
                self.finish_commit(op, later)
                return
            if outcome is MoveOutcome.REFUSED:
                log.error("the commit of the half at %d cannot be stored: %s", op.half_offset, refusal(reply))
                self.finish_commit(op, later)
                return
            op.move_offset = 0  # tried again; after a lost reply, only once the log was looked at
            self.oplog.to_apply.append(op)
            if outcome is MoveOutcome.UNKNOWN:
                self.look.after(self.look_wait_end())

        self.front.send(out, commit, on_reply, timeout_ms=_REQUEST_TIMEOUT_MS)

    def finish_commit(self, op: Op, out: Effects) -> None:
        op.applied = True
        self.committed += 1
        self.answer_waiting(op.half_offset, "commit", out)

    def answer_waiting(self, offset: int, decision: str, out: Effects) -> None:
        """The producers waiting for the commit of ``offset``: done, or the half went the other way."""
        for waiter in self.decisions.waiting.pop(offset, []):
            reply = encode_reply(waiter.request_id, decision="commit") if decision == "commit" else encode_error(
                waiter.request_id, ErrorCode.TRANSACTION_ENDED, f"the half message at {offset} was rolled back")
            out.reply(waiter.reply_to, reply)

    # -- checks ------------------------------------------------------------------------------

    def run_checks(self, out: Effects) -> None:
        for offset in self.halves.due_checks(self.clock.wall_ms(), self.decisions.deciding):
            self.rollback_unanswered(offset, out)
        self.answer_parked(out)

    def rollback_unanswered(self, offset: int, out: Effects) -> None:
        try:
            half = self.reader.read(offset, limit=self.slots.get(CONFIRMED))
        except RecordError:
            self.halves.halves.pop(offset, None)
            return
        log.warning("the half message at %d was checked %d times without a decision: rolled back", offset,
                    self.config.transaction_check_max)
        self.decide(half, "rollback", [], out)

    def answer_parked(self, out: Effects) -> None:
        now, kept = self.clock.mono_ms(), []
        confirmed = self.slots.get(CONFIRMED)
        for parked in self.parked:
            views = self.halves.take_offered(parked.request.producer_group, parked.request.max_messages, self.reader,
                                             confirmed)
            if views or parked.deadline_ms <= now:
                out.reply(parked.reply_to, encode_reply(parked.request.id, checks=views))
            else:
                kept.append(parked)
        self.parked = kept

    # -- the loop ----------------------------------------------------------------------------

    def work(self, out: Effects) -> None:
        self.half_follower.pull(out, self.on_halves)
        if not self.op_follower.pulling:  # the pull sent now finds every op below this, or names it
            self.oplog.pull_applied = self.slots.get(self.op_owner_slot)
        self.op_follower.pull(out, lambda messages, _later: self.oplog.read(messages))
        ops = self.oplog.ops  # no op is applied before the look is done: its commit may be in the log
        start = min(ops[0].commit_log_offset if ops else self.checkpoint.scan_from, self.checkpoint.scan_from)
        if self.look.done(self.clock.mono_ms(), start, self.slots.get(CONFIRMED),
                          self.config.catch_up_bytes_per_turn_max):
            self.apply_ops(out)

    def look_wait_end(self) -> int:
        """When to look in the log for commits: once any commit still in the writer's queue is stored or refused."""
        return self.clock.mono_ms() + self.config.send_queue_wait_ms_max + 200

    def backlog(self) -> bool:
        return self.look.search is not None

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
        if advance_checkpoint(self.checkpoint, self.halves, self.oplog, self.slots.get(FLUSHED)):
            store_transaction_checkpoint(self.env.store_dir, self.checkpoint)
            self.halves.changed = False  # a refused write keeps it changed: the next second retries
            self.slots.set(HALVES_PENDING, len(self.halves))

    def detail(self) -> dict[str, int]:
        return {"halves": len(self.halves), "committed": self.committed, "rolled_back": self.rolled_back,
                "checks_offered": self.halves.checks_offered, "op_next": self.checkpoint.op_next,
                "disk_refusals": self.disk.count, "scan_from": self.checkpoint.scan_from}

    def condition(self) -> str:
        return self.disk.condition()

    def shutdown(self, out: Effects) -> None:
        self.halves.changed = True
        self.store_checkpoint()


if __name__ == "__main__":
    raise SystemExit(main(TransactionActor))
