"""The front: the one client endpoint, routing each request to the actor that serves it.

Binds the client ROUTER (default ``tcp://127.0.0.1:10911``). For each frame
it reads only the envelope (op, id, topic, queue id), checks the topic and
queue against the topic table it owns (``config/topics.json``), and then:

* ``send`` -> the writer, with the queue it chose (given, or round robin);
* ``pull`` -> the owner of that topic-queue; ``get_by_id`` -> an owner;
* ``pop`` -> the owner of its queue or, without a queue, an owner of the topic's queues in
  turn; ``ack``, ``change_invisible``, ``pop_stats`` -> the owner of their queue. A group's
  first pop of a topic creates its dead-letter topic ``%DLQ%{group}``. A (group, topic)
  either pops or commits offsets: the other is refused (GROUP_MODE_CONFLICT);
* ``query_by_key``: answered here, from the IndexFiles and the log mapped read-only
  (``engine/services/key_lookup.py``): the index builder writes them;
* ``delete_topic`` -> the writer, which records where the deletion falls in the
  log; on its answer the topic leaves the table and its consumer offsets go;
* ``create_topic``, ``list_topics``, ``ping``, ``status``, and consumer groups'
  ``commit_offset`` / ``fetch_offset`` (``config/consumerOffset.json``): answered here.

Changes to the topic table are group-committed: requests are handled in
batches (at most 256 a socket), the table is written once after a batch
that changed it, and only then are the requests that changed it (or that
name a topic whose entry is not on disk yet) answered or forwarded. A flood
of creates costs one write per batch, not one per create, and never keeps
the loop from its heartbeat.

The client frame is forwarded untouched (bodies are not decoded or copied
here) behind a ``Routed`` envelope whose order tells the backend what to do
with it (``engine/ipc/messages.py``); the reply comes back behind an
``Answered`` and goes out to its client as it is (``engine/ipc/wire.py``).
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

from engine.actors.base import Actor, Env, Handler, Port, main
from engine.actors.effects import Effects, Reply, Tell
from engine.errors import ErrorCode, RequestError
from engine.ipc import channels
from engine.ipc.channels import Channel, ClientFrame
from engine.ipc.messages import (
    INTERNAL,
    Ack,
    Answered,
    Append,
    ChangeInvisible,
    DeleteTopic,
    EndTransaction,
    GetById,
    GetByOffset,
    OffsetForTime,
    Order,
    Pop,
    PopElsewhere,
    PopStats,
    Pull,
    QueueStats,
    Routed,
    TopicDeletion,
    TransactionChecks,
)
from engine.ipc.protocol import (
    CommitOffsetRequest,
    CreateTopicRequest,
    Envelope,
    FetchOffsetRequest,
    GetByIdRequest,
    GetByOffsetRequest,
    decode_envelope,
    decode_request,
    encode_error,
    encode_reply,
    safe_request_id,
)
from engine.ipc.wire import Inbound, Origin
from engine.layout import decode_msg_id, java_string_hash
from engine.metrics.report import Figures
from engine.names import dead_letter_topic, validate_group, validate_topic
from engine.services.key_lookup import KeyLookup
from engine.store.consumer_offsets import ConsumerOffsets
from engine.store.disk_refusals import DiskRefusals
from engine.store.pop_files import POP_DIR
from engine.store.records import owner_of
from engine.store.shared_offsets import MIN_OFFSET, TOPIC_DELETIONS, SharedOffsets
from engine.store.system_topics import SYSTEM_TOPICS
from engine.store.topics import TopicTable

log = logging.getLogger(__name__)

@functools.lru_cache(maxsize=4096)
def _queues_by_owner(topic: str, queue_count: int, owner_count: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """(owner, its queue ids of the topic) for each owner holding some, in owner order."""
    by_owner: dict[int, list[int]] = {}
    for queue_id in range(queue_count):
        by_owner.setdefault(owner_of(topic, queue_id, owner_count), []).append(queue_id)
    return tuple((owner, tuple(queue_ids)) for owner, queue_ids in sorted(by_owner.items()))


class PendingDeletion(NamedTuple):
    """A ``delete_topic`` forwarded to the writer and not answered yet: sent again, as it came,
    if the writer restarts before answering it."""

    origin: Origin
    raw: bytes


class FrontActor(Actor):
    """Takes client requests on ``clients`` and ``front-internal``, and answers on the backends'
    channels; gives client replies, and requests routed to the backends (``Append``,
    ``DeleteTopic``, ``Pull``, ...)."""

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.topics = TopicTable(env.store_dir)
        self.consumer_offsets = ConsumerOffsets(env.store_dir, entries_max=env.config.consumer_offset_entries_max)
        self.last_persist_ms = 0
        self.round_robin: dict[str, itertools.count[int]] = {}
        self.owner_count = env.config.consume_queue_owner_count
        self.owners = [channels.owner(k) for k in range(self.owner_count)]
        self.requests_served = 0
        self.requests_by_op: dict[str, int] = {}  # since this process started, for metrics
        self.refusals: dict[str, int] = {}  # BUSY and SERVICE_NOT_AVAILABLE given for an actor
        self.deleting: dict[str, list[PendingDeletion]] = {}  # forwarded to the writer, not yet answered
        self.redo_deletions = False  # the writer restarted with deletions unanswered: send them again
        self.lookup = KeyLookup(env.store_dir, env.config)
        self.sync_flush = env.config.flush_mode == "SYNC_FLUSH"
        self.log_min_offset = 0
        self.writer_up = False  # the writer's port is connected: a full queue to it means BUSY
        # What waits for the topic table to be on disk: requests to route again, and replies.
        self.held: list[tuple[Origin, bytes, bytes]] = []  # whom to answer, request, its sender's IP
        self.held_replies: list[Reply] = []
        # A disk that refuses the table's write: what waited is refused, the save retried each tick.
        self.table_writes = DiskRefusals("front: the topic table", errnos=None)
        # (group, topic) pairs that pop: from the pop state's directories, and every pop since
        self.pop_groups = {(path.parent.name, path.name) for path in (env.store_dir / POP_DIR).glob("*/*")}
        self.pop_turn: dict[str, int] = {}

    def ports(self) -> list[Port]:
        cfg = self.config

        def backend(channel: Channel, *, hwm: int | None = None, monitor: bool = False) -> Port:
            # IMMEDIATE: refuse, rather than queue for, an actor that is down; find a restarted one in ~10 ms.
            return Port(channel, bind=False, immediate=True, reconnect_ivl_ms=10, hwm=hwm, monitor=monitor)

        return [Port(channels.CLIENTS, bind=True, address=cfg.endpoint, max_message_bytes=cfg.client_frame_bytes_max,
                     curve=cfg.curve_enabled, peer_address=True),
                Port(channels.FRONT_INTERNAL, bind=True, max_message_bytes=cfg.client_frame_bytes_max),
                backend(channels.WRITER, hwm=cfg.writer_queue_requests_max, monitor=True),
                backend(channels.TRANSACTIONS), *map(backend, self.owners)]

    def handlers(self) -> dict[type, Handler]:
        return {ClientFrame: self.on_request, Answered: self.on_answer}

    def recover(self, out: Effects) -> None:
        """The system topics (one queue each) are in the table before any client is served."""
        for topic in SYSTEM_TOPICS:
            if self.topics.get(topic) is None:
                self.topics.create(topic, 1, topic_count_max=self.config.topic_count_max, system=True)
        if self.topics.unsaved:
            self.topics.save()

    def on_request(self, _frame: ClientFrame, inbound: Inbound, out: Effects) -> None:
        assert inbound.origin is not None
        self.requests_served += 1
        self.serve(inbound.origin, inbound.payload, out, inbound.peer_ip)

    def drained(self, channel: Channel, out: Effects) -> None:
        """Group commit: write the topic table once for the batch, then let what waited on it go.

        If the disk refuses the write, every request that waited is answered DISK_FULL (or
        SERVICE_NOT_AVAILABLE for another error of the disk) and nothing it asked for is
        announced: the table keeps its changes in memory and the save is tried again each tick
        (``tick``), and for the next request that needs it. A retried request finds its change
        made and waits for that save again. The writer's answers to deletions go out either
        way: the deletion is on disk in the writer's table."""
        if self.topics.unsaved:
            try:
                self.topics.save()
            except OSError as exc:
                self.table_writes.refused(exc)
                self.refuse_held(exc, out)
                return
            self.table_writes.written()
            self.persist_offsets()  # a deletion's dropped offsets go to disk with the table
        replies, self.held_replies = self.held_replies, []
        out.extend(replies)
        held, self.held = self.held, []
        for origin, raw, peer_ip in held:
            self.serve(origin, raw, out, peer_ip)

    def refuse_held(self, exc: OSError, out: Effects) -> None:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        refusal = RequestError(ErrorCode.DISK_FULL if full else ErrorCode.SERVICE_NOT_AVAILABLE,
                               f"the topic table cannot be saved: {exc.strerror or exc}; retry later")
        replies, self.held_replies = self.held_replies, []
        out.extend(replies)
        held, self.held = self.held, []
        for origin, raw, _peer_ip in held:
            self.refusals[refusal.code.name] = self.refusals.get(refusal.code.name, 0) + 1
            out.append(self.error_reply(origin, raw, refusal))

    def connection(self, channel: Channel, up: bool) -> None:
        if up and self.deleting:  # a new writer: what the old one took and did not answer may be lost
            self.redo_deletions = True
        self.writer_up = up

    def answered(self, topic: str, origin: Origin) -> bool:
        """The writer answered a deletion of ``topic`` for ``origin``: it is no longer pending. False
        when none is (the answer to a deletion sent twice, whose first answer came)."""
        for pending in self.deleting.get(topic, ()):
            if pending.origin == origin:
                self.forget_deletion(topic, pending)
                return True
        return False

    def forget_deletion(self, topic: str, pending: PendingDeletion) -> None:
        waiting = self.deleting.get(topic, [])
        if pending in waiting:
            waiting.remove(pending)
        if not waiting:
            self.deleting.pop(topic, None)

    def forward_deletion(self, topic: str, pending: PendingDeletion,
                         refused: Callable[[], Reply | None] | None = None) -> Tell:
        """To the writer; refused (the writer is down or busy), it is no longer pending and its client
        is told so, unless ``refused`` says otherwise."""
        tell = self.forward(channels.WRITER, pending.origin, DeleteTopic(), pending.raw)
        return tell._replace(refused=refused or partial(self.deletion_refused, topic, pending))

    def deletion_refused(self, topic: str, pending: PendingDeletion) -> Reply:
        self.forget_deletion(topic, pending)
        return self.refusal(channels.WRITER, pending.origin, pending.raw, DeleteTopic())

    def send_deletions_again(self, out: Effects) -> None:
        """After a writer restart, the deletions it had not answered: it may have recorded them or not,
        and the topic stays "being deleted" until one is answered. A deletion recorded twice deletes
        nothing more the second time: the front sent nothing for the topic in between, and the writer
        takes its requests in order. A second answer is dropped (``answered``)."""
        self.redo_deletions = False
        for topic, waiting in self.deleting.items():
            log.warning("the writer restarted before answering %d deletion(s) of %r: sent again", len(waiting), topic)
            for pending in waiting:
                out.append(self.forward_deletion(topic, pending, self.redo_refused))

    def redo_refused(self) -> None:
        self.redo_deletions = True  # the writer is down or busy again: at a later tick

    def hold(self, origin: Origin, raw: bytes, peer_ip: bytes = b"") -> None:
        """Route this request again once the topic table is on disk."""
        self.held.append((origin, raw, peer_ip))

    def on_answer(self, answer: Answered, inbound: Inbound, out: Effects) -> None:
        """A backend's answer, for the client named in it (the writer's, an owner's, the transaction actor's)."""
        origin = Origin(channels.FRONT_INTERNAL if answer.flag == INTERNAL else channels.CLIENTS, answer.client,
                        flag=answer.flag)
        note = answer.note
        if isinstance(note, PopElsewhere):  # the payload is the client's pop: on to the next owner
            out.append(self.pop_at(origin, inbound.payload, note.then))
            return
        relay = Reply(origin, inbound.payload)
        if isinstance(note, TopicDeletion):  # the writer's word on a topic deletion
            if not self.answered(note.topic, origin):
                log.info("a second answer to the deletion of %r (sent again after a writer restart) is dropped: "
                         "its client has the first", note.topic)
                return
            if note.recorded:
                self.finish_deletion(note.topic)
                self.held_replies.append(relay)
                return
        out.append(relay)

    def serve(self, origin: Origin, raw: bytes, out: Effects, peer_ip: bytes = b"") -> None:
        """``peer_ip``: the client's IP (4 or 16 bytes), the born host of what it sends; b"" when
        it has none (ipc://, an actor on the internal port)."""
        try:
            self.route(origin, raw, out, peer_ip)
        except RequestError as exc:
            out.append(self.error_reply(origin, raw, exc))

    @staticmethod
    def error_reply(origin: Origin, raw: bytes, exc: RequestError) -> Reply:
        return Reply(origin, encode_error(safe_request_id(raw), exc.code, exc.message))

    def route(self, origin: Origin, raw: bytes, out: Effects, peer_ip: bytes = b"") -> None:
        envelope = decode_envelope(raw)
        op = envelope.op
        self.requests_by_op[op] = self.requests_by_op.get(op, 0) + 1
        if envelope.topic in self.topics.unsaved:  # its entry is not on disk yet: after the batch's write
            self.hold(origin, raw, peer_ip)
            return
        if op == "send":
            if self.auto_create(envelope):
                self.hold(origin, raw, peer_ip)
                return
            internal = origin.channel is channels.FRONT_INTERNAL
            if envelope.topic in SYSTEM_TOPICS and not internal:
                raise RequestError(ErrorCode.INVALID_TOPIC, f"the topic {envelope.topic!r} is reserved for the system")
            queue_id = self.choose_queue(envelope)
            out.append(self.forward(channels.WRITER, origin, Append(queue_id, self.clock.mono_ms(), internal,
                                                                    peer_ip), raw))
        elif op == "pull":
            out.append(self.forward(self.queue_owner(envelope), origin, Pull(), raw))
        elif op == "pop":
            self.route_pop(origin, raw, envelope, out)
        elif op in ("ack", "change_invisible", "pop_stats"):
            owner = self.queue_owner(envelope)
            self.pop_group(envelope)
            request = Ack() if op == "ack" else ChangeInvisible() if op == "change_invisible" else PopStats()
            out.append(self.forward(owner, origin, request, raw))
        elif op in ("end_transaction", "transaction_checks"):
            decode_request(op, raw)  # refused here if malformed: the actor gets only valid requests
            decided = EndTransaction() if op == "end_transaction" else TransactionChecks()
            out.append(self.forward(channels.TRANSACTIONS, origin, decided, raw))
        elif op == "query_by_key":
            self.check_topic(envelope)
            visible_end = self.slots.visible_end(sync_flush=self.sync_flush)
            out.append(Reply(origin, self.lookup.answer(raw, visible_end=visible_end,
                                                                   deletions=self.slots.get(TOPIC_DELETIONS))))
        elif op == "get_by_id":
            out.append(self.forward(self.owner_for_record(op, raw), origin, GetById(), raw))
        elif op == "queue_stats":
            out.append(self.forward(self.queue_owner(envelope), origin, QueueStats(), raw))
        elif op == "offset_for_time":
            out.append(self.forward(self.queue_owner(envelope), origin, OffsetForTime(), raw))
        elif op == "get_by_offset":
            out.append(self.forward(self.owner_for_record(op, raw), origin, GetByOffset(), raw))
        elif op == "delete_topic":
            topic = self.check_topic(envelope, deleting_ok=True)
            if topic in SYSTEM_TOPICS:
                raise RequestError(ErrorCode.INVALID_TOPIC, f"the topic {topic!r} is the engine's own: it cannot "
                                                            f"be deleted")
            decode_request(op, raw)
            pending = PendingDeletion(origin, raw)
            self.deleting.setdefault(topic, []).append(pending)
            out.append(self.forward_deletion(topic, pending))
        elif op == "create_topic":
            if self.create_topic(envelope, raw):
                self.hold(origin, raw)  # answered once the new entry is on disk
            else:
                config = self.topics.get(envelope.topic or "")
                assert config is not None
                out.append(Reply(origin, encode_reply(envelope.id, topic=config.topic_name,
                                                                 queue_count=config.write_queue_nums)))
        else:
            out.append(Reply(origin, self.local(op, envelope, raw)))

    def pop_group(self, envelope: Envelope) -> str:
        group = envelope.group
        if not isinstance(group, str):
            raise RequestError(ErrorCode.INVALID_FIELD, "the field 'group' is required and must be a string")
        validate_group(group)
        if f"{envelope.topic}@{group}" in self.consumer_offsets.table:
            raise RequestError(ErrorCode.GROUP_MODE_CONFLICT,
                               f"group {group!r} commits offsets on topic {envelope.topic!r}: it cannot pop it too "
                               f"(use another group)")
        return group

    def route_pop(self, origin: Origin, raw: bytes, envelope: Envelope, out: Effects) -> None:
        """To the owner of the pop's queue, or to the next owner holding queues of the topic."""
        topic = self.check_topic(envelope)
        group = self.pop_group(envelope)
        dead_letters = dead_letter_topic(group)
        if self.topics.get(dead_letters) is None:
            self.topics.create(dead_letters, 1, topic_count_max=self.config.topic_count_max, system=True)
            self.hold(origin, raw)  # forwarded once the dead-letter topic is on disk
            return
        self.pop_groups.add((group, topic))
        if envelope.queue_id is not None:
            owner = self.queue_owner(envelope)  # checks the queue id
            out.append(self.forward(owner, origin, Pop([envelope.queue_id]), raw))
            return
        config = self.topics.get(topic)
        assert config is not None
        by_owner = _queues_by_owner(topic, config.read_queue_nums, self.owner_count)
        turn = self.pop_turn.get(topic, 0) % len(by_owner)
        self.pop_turn[topic] = turn + 1
        order = [(owner, list(queue_ids)) for owner, queue_ids in by_owner[turn:] + by_owner[:turn]]
        out.append(self.pop_at(origin, raw, order))

    def pop_at(self, origin: Origin, raw: bytes, order: list[tuple[int, list[int]]]) -> Tell:
        """The pop for the first owner of ``order``; it hands the pop back if it has nothing now and
        others are left, so every owner's queues are looked at before one waits (long polling)."""
        (owner, queue_ids), *then = order
        return self.forward(self.owners[owner], origin, Pop(queue_ids, then), raw)

    def queue_owner(self, envelope: Envelope) -> Channel:
        """The channel of the owner of the request's (topic, queue), once both are checked."""
        queue_id = self.check_queue(envelope)
        return self.owners[owner_of(envelope.topic or "", queue_id, self.owner_count)]

    def forward(self, channel: Channel, origin: Origin, order: Order, raw: bytes) -> Tell:
        """The request, routed to the actor behind ``channel``; refused at once when its queue is full."""
        return Tell(channel, Routed(origin.peer, origin.flag, order), raw,
                    partial(self.refusal, channel, origin, raw, order))

    def refusal(self, channel: Channel, origin: Origin, raw: bytes, order: Order) -> Reply:
        """The answer to a request the actor behind ``channel`` could not take: BUSY from a writer that
        is up (its queue is full), SERVICE_NOT_AVAILABLE from an actor that is down."""
        if channel is channels.WRITER and self.writer_up:
            refusal = RequestError(ErrorCode.BUSY, f"{self.config.writer_queue_requests_max} sends are already "
                                                   f"waiting for the writer; retry later")
        else:
            op = type(order).__struct_config__.tag
            refusal = RequestError(ErrorCode.SERVICE_NOT_AVAILABLE,
                                   f"the actor serving {op!r} is not available; retry later")
        self.refusals[refusal.code.name] = self.refusals.get(refusal.code.name, 0) + 1
        return self.error_reply(origin, raw, refusal)

    def finish_deletion(self, topic: str) -> None:
        """The writer recorded the deletion: the topic and its groups' offsets go."""
        self.topics.delete(topic)
        self.round_robin.pop(topic, None)
        groups = self.consumer_offsets.forget_topic(topic)
        self.pop_groups = {(group, name) for group, name in self.pop_groups if name != topic}
        log.info("topic %r deleted (%d consumer groups' offsets dropped)", topic, groups)

    def check_topic(self, envelope: Envelope, *, deleting_ok: bool = False) -> str:
        if not isinstance(envelope.topic, str):
            raise RequestError(ErrorCode.INVALID_FIELD, "the field 'topic' is required and must be a string")
        if envelope.topic in self.deleting and not deleting_ok:
            raise RequestError(ErrorCode.TOPIC_NOT_FOUND, f"topic {envelope.topic!r} is being deleted")
        if self.topics.get(envelope.topic) is not None:
            return envelope.topic  # an existing topic was validated when it was created
        validate_topic(envelope.topic)
        if self.topics.get(envelope.topic) is None:
            raise RequestError(ErrorCode.TOPIC_NOT_FOUND, f"topic {envelope.topic!r} does not exist")
        return envelope.topic

    def check_queue(self, envelope: Envelope) -> int:
        topic = self.check_topic(envelope)
        queue_id = envelope.queue_id
        if not isinstance(queue_id, int) or isinstance(queue_id, bool):
            raise RequestError(ErrorCode.INVALID_FIELD, "the field 'queue_id' is required and must be an integer")
        config = self.topics.get(topic)
        assert config is not None
        if not 0 <= queue_id < config.read_queue_nums:
            last = config.read_queue_nums - 1
            raise RequestError(ErrorCode.QUEUE_NOT_FOUND,
                               f"topic {topic!r} has queues 0..{last}; there is no queue {queue_id}")
        return queue_id

    def auto_create(self, envelope: Envelope) -> bool:
        """A send to a topic that does not exist creates it (``auto_create_topic``); True if it did."""
        topic = envelope.topic
        if not (self.config.auto_create_topic and isinstance(topic, str) and self.topics.get(topic) is None):
            return False
        if self.topics.user_topic_count() >= self.config.auto_create_topics_max:
            raise RequestError(ErrorCode.LIMIT_EXCEEDED,
                               f"topic {topic!r} does not exist and the store holds {self.topics.user_topic_count()} "
                               f"topics (auto_create_topics_max): create it with create_topic, or raise the limit")
        self.topics.create(validate_topic(topic), self.config.topic_queue_count_default,
                           topic_count_max=self.config.topic_count_max)
        return True

    def create_topic(self, envelope: Envelope, raw: bytes) -> bool:
        """Create or grow the topic in the table; True if the table changed (it must be saved first)."""
        request = decode_request("create_topic", raw)
        assert isinstance(request, CreateTopicRequest)
        count = request.queue_count
        if request.topic in self.deleting:
            raise RequestError(ErrorCode.BUSY, f"topic {request.topic!r} is being deleted; retry later")
        if count is not None and count > self.config.topic_queue_count_max:
            raise RequestError(ErrorCode.INVALID_FIELD,
                               f"queue_count {count} exceeds topic_queue_count_max {self.config.topic_queue_count_max}")
        self.topics.create(request.topic, count, default_queue_count=self.config.topic_queue_count_default,
                           topic_count_max=self.config.topic_count_max)
        return request.topic in self.topics.unsaved

    def choose_queue(self, envelope: Envelope) -> int:
        if envelope.queue_id is not None:
            return self.check_queue(envelope)
        topic = self.check_topic(envelope)
        config = self.topics.get(topic)
        assert config is not None
        if isinstance(envelope.sharding_key, str):
            # Per-key order: one key always lands in one queue (while the queue count stays).
            return abs(java_string_hash(envelope.sharding_key)) % config.write_queue_nums
        counter = self.round_robin.setdefault(topic, itertools.count())
        return next(counter) % config.write_queue_nums

    def owner_for_record(self, op: str, raw: bytes) -> Channel:
        """The owner that reads a record by id or by offset: the same for both, by the record's segment,
        so reads of one segment share one owner's mapping and reads of the log spread over the owners."""
        request = decode_request(op, raw)
        if isinstance(request, GetByOffsetRequest):
            offset = request.commit_log_offset
        else:
            assert isinstance(request, GetByIdRequest)
            try:
                _host, offset = decode_msg_id(request.msg_id)
            except ValueError as exc:
                raise RequestError(ErrorCode.INVALID_MSG_ID, f"not a message id: {exc}") from None
        return self.owners[(offset // self.config.segment_size_bytes) % self.owner_count]

    def local(self, op: str, envelope: Envelope, raw: bytes) -> bytes:
        request = decode_request(op, raw)
        if op == "list_topics":
            topics = [{"topic": name, "queue_count": cfg.write_queue_nums}
                      for name, cfg in sorted(self.topics.topics.items())
                      if name not in self.deleting and name not in SYSTEM_TOPICS]
            return encode_reply(envelope.id, topics=topics)
        if op == "ping":
            return encode_reply(envelope.id, pong=True)
        if op in ("commit_offset", "fetch_offset"):
            assert isinstance(request, CommitOffsetRequest | FetchOffsetRequest)
            self.check_queue(envelope)
            if isinstance(request, CommitOffsetRequest):
                if (request.group, request.topic) in self.pop_groups:
                    raise RequestError(ErrorCode.GROUP_MODE_CONFLICT,
                                       f"group {request.group!r} pops topic {request.topic!r}: it has no offsets "
                                       f"to commit (use another group)")
                self.consumer_offsets.commit(request.group, request.topic, request.queue_id, request.offset)
                return encode_reply(envelope.id)
            return encode_reply(envelope.id, offset=self.consumer_offsets.fetch(request.group, request.topic,
                                                                                request.queue_id))
        assert op == "status"
        offsets: SharedOffsets = self.slots
        return encode_reply(envelope.id, offsets=offsets.snapshot(self.owner_count),
                            topics=len(self.topics.topics), flush_mode=self.config.flush_mode)

    def tick(self, out: Effects) -> None:
        now_ms = self.clock.mono_ms()
        if self.redo_deletions:
            self.send_deletions_again(out)
        self.drained(channels.CLIENTS, out)  # a held request that changed the table again
        log_min = self.slots.get(MIN_OFFSET)
        if log_min > self.log_min_offset:  # retention deleted segments: let their mappings go
            self.log_min_offset = log_min
            self.lookup.after_retention()
        if now_ms - self.last_persist_ms >= self.config.consumer_offset_persist_interval_ms:
            self.last_persist_ms = now_ms
            self.persist_offsets()

    def persist_offsets(self) -> None:
        try:
            self.consumer_offsets.persist()
        except OSError as exc:
            log.error("cannot persist consumer offsets: %s; kept in memory, retried", exc)

    def shutdown(self, out: Effects) -> None:
        self.persist_offsets()
        self.lookup.close()

    def detail(self) -> dict[str, int]:
        return {"requests": self.requests_served, "topics": len(self.topics.topics),
                "disk_refusals": self.table_writes.count}

    def condition(self) -> str:
        return "" if not self.table_writes.refusing else f"cannot save the topic table: {self.table_writes.reason}"

    def metrics(self) -> Figures:
        committed = [[key.partition("@")[2], key.partition("@")[0], queue_id, offset]
                     for key, queues in self.consumer_offsets.table.items() for queue_id, offset in queues.items()]
        return {"rmqpy_requests": [[op, count] for op, count in self.requests_by_op.items()],
                "rmqpy_refusals": [[code, "front", count] for code, count in self.refusals.items()],
                "rmqpy_group_committed_offset": committed}


if __name__ == "__main__":
    raise SystemExit(main(FrontActor))
