"""The front: the one client endpoint, routing each request to the actor that serves it.

Binds the client ROUTER (default ``tcp://127.0.0.1:10911``). For each frame
it reads only the envelope (op, id, topic, queue id), checks the topic and
queue against the topic table it owns (``config/topics.json``, its rules in
``engine/services/front/topic_rules.py``), and then, by its routing table:

* ``send`` -> the writer, with the queue it chose (given, or round robin);
* ``pull``, ``queue_stats``, ``offset_for_time`` -> the owner of that topic-queue;
  ``get_by_id``, ``get_by_offset`` -> the owner of the record's segment;
* ``pop`` -> the owner of its queue or, without a queue, an owner of the topic's queues in
  turn (``engine/services/pop/fan_out.py``); ``ack``, ``change_invisible``, ``pop_stats`` ->
  the owner of their queue. A group's first pop of a topic creates its dead-letter topic
  ``%DLQ%{group}``. A (group, topic) either pops or commits offsets: the other is refused
  (GROUP_MODE_CONFLICT, ``engine/services/front/consumer_groups.py``);
* ``end_transaction``, ``transaction_checks`` -> the transaction actor;
* ``query_by_key``, ``query_by_keys``: answered here, from the IndexFiles and the log mapped read-only
  (``engine/services/front/key_lookup.py``): the index builder writes them;
* ``delete_topic`` -> the writer, which records where the deletion falls in the
  log; on its answer the topic leaves the table and its consumer offsets go (the
  deletions not answered yet: ``engine/services/front/topic_deletions.py``);
* ``create_topic``, ``list_topics``, ``ping``, ``status`` (``engine/services/front/figures.py``),
  consumer groups' ``commit_offset`` / ``fetch_offset`` (``config/consumerOffset.json``) and
  ``heartbeat`` (the members sharing a topic's queues, ``engine/services/front/group_members.py``):
  answered here.

Changes to the topic table are group-committed: requests are handled in
batches (at most 256 a socket), the table is written once after a batch
that changed it, and only then are the requests that changed it (or that
name a topic whose entry is not on disk yet) answered or forwarded. A flood
of creates costs one write per batch, not one per create, and never keeps
the loop from its heartbeat.

At a stop, the requests still queued on both client ports, and those that waited for the
table, are answered SERVICE_NOT_AVAILABLE (``Actor.refuse_at_stop``); an answer a backend makes
after the front stopped reaches its client only straight from that backend (``direct_replies``).

The client frame is forwarded untouched (bodies are not decoded or copied
here) behind a ``Routed`` envelope whose order tells the backend what to do
with it (``engine/ipc/messages.py``); the reply comes back behind an
``Answered`` and goes out to its client as it is (``engine/ipc/wire.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from engine.actors.base import Actor, Env, Handler, Port, main
from engine.actors.effects import Effects, Reply, Tell
from engine.coordination.role import Role
from engine.coordination.routes_mirror import RoutesMirror
from engine.errors import ErrorCode, RequestError
from engine.ipc import channels, direct_replies
from engine.ipc.channels import Channel, ClientFrame
from engine.ipc.curve import public_key_of
from engine.ipc.endpoints import MASTER_ENDPOINT_FILE
from engine.ipc.lifecycle import Lifecycle
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
    STOPPING_MESSAGE,
    CommitOffsetRequest,
    Envelope,
    FetchOffsetRequest,
    GetByIdRequest,
    GetByOffsetRequest,
    HeartbeatRequest,
    RouteRequest,
    decode_envelope,
    decode_request,
    encode_error,
    encode_reply,
    safe_request_id,
)
from engine.ipc.wire import Inbound, Origin
from engine.layout import decode_msg_id
from engine.logs import LOG_DIR
from engine.metrics.report import Figures
from engine.names import dead_letter_topic
from engine.security.audit import AuditLog
from engine.security.guard import Guard, ip_text
from engine.security.ops import AUDITED_OPS, checks_of
from engine.services.front.consumer_groups import ConsumerGroups
from engine.services.front.figures import FrontFigures
from engine.services.front.key_lookup import KeyLookup
from engine.services.front.shipped_config import ShippedConfig
from engine.services.front.topic_deletions import PendingDeletion, TopicDeletions
from engine.services.front.topic_rules import TopicRules
from engine.services.pop.fan_out import PopFanOut, PopOrder
from engine.store.records import owner_of
from engine.store.send_routes import RoutesPublisher
from engine.store.shared_offsets import LEASE_DEADLINE, MIN_OFFSET, TOPIC_DELETIONS

log = logging.getLogger(__name__)

# The routing table: the ops forwarded as they are, and the order each one's actor is given. The
# other ops are served here (the topic table, consumer offsets, key lookups, status), or routed
# with a rule of their own (send: a queue is chosen; pop: the owners in turn; delete_topic).
_TO_QUEUE_OWNER: dict[str, Callable[[], Order]] = {  # the owner of the request's (topic, queue)
    "pull": Pull, "queue_stats": QueueStats, "offset_for_time": OffsetForTime,
    "ack": Ack, "change_invisible": ChangeInvisible, "pop_stats": PopStats}
_POP_OPS = ("ack", "change_invisible", "pop_stats")  # of a pop group: not one that commits offsets
# the owner of the record's segment
_TO_RECORD_OWNER: dict[str, Callable[[], Order]] = {"get_by_id": GetById, "get_by_offset": GetByOffset}
_TO_TRANSACTIONS: dict[str, Callable[[], Order]] = {"end_transaction": EndTransaction,
                                                    "transaction_checks": TransactionChecks}
# what a replica refuses (NOT_MASTER): every op that writes, here or in a backend
_WRITES = frozenset({"send", "create_topic", "delete_topic", "commit_offset", "pop", "ack", "change_invisible",
                     "end_transaction", "transaction_checks", "heartbeat"})


def record_owner(op: str, raw: bytes, segment_size_bytes: int, owner_count: int) -> int:
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
    return (offset // segment_size_bytes) % owner_count


class FrontActor(Actor):
    """Takes client requests on ``clients`` and ``front-internal``, and answers on the backends'
    channels; gives client replies, and requests routed to the backends (``Append``,
    ``DeleteTopic``, ``Pull``, ...)."""

    drain_at_stop = (channels.CLIENTS, channels.FRONT_INTERNAL)

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.deletions = TopicDeletions()  # forwarded to the writer, not yet answered
        self.topics = TopicRules(env.store_dir, env.config, self.deletions)
        self.send_routes = RoutesPublisher(env.run_dir, env.slots)  # the table as the writer checks sends
        self.groups = ConsumerGroups(env.store_dir, env.config, self.clock.mono_ms())
        self.owner_count = env.config.consume_queue_owner_count
        self.owners = [channels.owner(k) for k in range(self.owner_count)]
        self.pop_fan_out = PopFanOut(self.owner_count)
        self.figures = FrontFigures()
        self.lookup = KeyLookup(env.store_dir, env.config)
        self.sync_flush = env.config.flush_mode == "SYNC_FLUSH"
        self.log_min_offset = 0
        self.writer_up = False  # the writer's port is connected: a full queue to it means BUSY
        # What waits for the topic table to be on disk: requests to route again, and replies.
        self.held: list[tuple[Origin, bytes, bytes, str]] = []  # whom to answer, request, its sender's IP and key
        self.held_replies: list[Reply] = []
        self.shipped = ShippedConfig(env.store_dir) if env.config.is_replica else None
        self.routes = RoutesMirror(env.run_dir)  # the cluster's topic routes (an engine elected on etcd)
        # Who may do what (docs/security.md): on a CURVE client port, each request's key is a user.
        # The gRPC endpoint's own key is trusted: it has checked its callers' policies itself.
        cfg = env.config
        self.guard = None
        self.routing_held = False
        self.trusted_keys: frozenset[str] = frozenset()
        self.requester = ("", "")  # the user and the address of the request being served
        if cfg.acl_enabled and cfg.curve_enabled:
            self.guard = Guard(env.store_dir, AuditLog(env.store_dir / LOG_DIR / f"audit-{env.name}.jsonl",
                                                       bytes_max=cfg.audit_log_bytes_max,
                                                       files_kept=cfg.audit_log_files_kept))
            if cfg.grpc_enabled and cfg.grpc_curve_client_secret_key_file:
                self.trusted_keys = frozenset({public_key_of(cfg.grpc_curve_client_secret_key_file)})

    def ports(self) -> list[Port]:
        cfg = self.config

        def backend(channel: Channel, *, hwm: int | None = None, monitor: bool = False) -> Port:
            # IMMEDIATE: refuse, rather than queue for, an actor that is down; find a restarted one in ~10 ms.
            # A replica runs no transaction actor: nothing to wait for there.
            return Port(channel, bind=False, immediate=True, reconnect_ivl_ms=10, hwm=hwm, monitor=monitor,
                        await_peer=not (channel is channels.TRANSACTIONS and cfg.is_replica))

        return [Port(channels.CLIENTS, bind=True, address=cfg.endpoint, max_message_bytes=cfg.client_frame_bytes_max,
                     curve=cfg.curve_enabled, peer_address=True),
                Port(channels.FRONT_INTERNAL, bind=True, max_message_bytes=cfg.client_frame_bytes_max),
                backend(channels.WRITER, hwm=cfg.writer_queue_requests_max, monitor=True),
                backend(channels.TRANSACTIONS), *map(backend, self.owners)]

    def handlers(self) -> dict[type, Handler]:
        return {ClientFrame: self.on_request, Answered: self.on_answer}

    def recover(self, out: Effects) -> None:
        self.topics.add_system_topics()
        self.publish_routes()

    def publish_routes(self) -> None:
        """The saved table, for the writer's checks of the sends made straight to it
        (``engine/store/send_routes.py``). A file that cannot be written leaves the writer the
        version before: never more permissive (queues only grow, and a deletion the writer
        recorded stops the sends it takes for that topic), only slower (it passes on sends to
        the topics it does not know)."""
        try:
            self.send_routes.publish(self.topics.table.topics)
        except OSError as exc:
            log.error("cannot write the send routes for the writer: %s (sends to new topics go through "
                      "the front)", exc)

    def on_request(self, _frame: ClientFrame, inbound: Inbound, out: Effects) -> None:
        assert inbound.origin is not None
        self.figures.requests_served += 1
        self.serve(inbound.origin, inbound.payload, out, inbound.peer_ip, inbound.peer_key)

    def drained(self, channel: Channel, out: Effects) -> None:
        """Group commit: write the topic table once for the batch, then let what waited on it go.

        A write the disk refuses (``TopicRules.save``) refuses every request that waited, and
        announces nothing it asked for: the save is tried again each tick and for the next
        request that needs it (a retried request finds its change made and waits for that save
        again). The writer's answers to deletions go out either way: on disk in its table. At a
        stop, what waited is refused: the front routes nothing more."""
        refusal = None
        if self.topics.unsaved:
            refusal = self.topics.save()
            if refusal is None:
                self.groups.persist()  # a deletion's dropped offsets go to disk with the table
                self.publish_routes()
        if refusal is None and self.lifecycle is Lifecycle.STOPPING:
            refusal = RequestError(ErrorCode.SERVICE_NOT_AVAILABLE, STOPPING_MESSAGE)
        replies, self.held_replies = self.held_replies, []
        out.extend(replies)
        held, self.held = self.held, []
        self.routing_held = True  # checked again (an ACL change may refuse it now), audited once
        for origin, raw, peer_ip, peer_key in held:
            if refusal is None:
                self.serve(origin, raw, out, peer_ip, peer_key)
            else:
                self.figures.refused(refusal.code)
                out.append(self.error_reply(origin, raw, refusal))
        self.routing_held = False

    def hold(self, origin: Origin, raw: bytes, peer_ip: bytes = b"", peer_key: str = "") -> None:
        """Route this request again once the topic table is on disk."""
        self.held.append((origin, raw, peer_ip, peer_key))

    def connection(self, channel: Channel, up: bool) -> None:
        if up:
            self.deletions.writer_connected()
        self.writer_up = up

    def forward_deletion(self, topic: str, pending: PendingDeletion,
                         refused: Callable[[], Reply | None] | None = None) -> Tell:
        """To the writer; refused (the writer is down or busy), it is no longer pending and its client
        is told so, unless ``refused`` says otherwise."""
        tell = self.forward(channels.WRITER, pending.origin, DeleteTopic(), pending.raw)
        return tell._replace(refused=refused or partial(self.deletion_refused, topic, pending))

    def deletion_refused(self, topic: str, pending: PendingDeletion) -> Reply:
        self.deletions.forget(topic, pending)
        return self.refusal(channels.WRITER, pending.origin, pending.raw, DeleteTopic())

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
            if not self.deletions.answered(note.topic, origin):
                log.info("a second answer to the deletion of %r (sent again after a writer restart) is dropped: "
                         "its client has the first", note.topic)
                return
            if note.recorded:  # the topic and its groups' offsets go, announced once the table is saved
                self.topics.forget(note.topic)
                self.send_routes.forget(note.topic)
                groups = self.groups.forget_topic(note.topic)
                log.info("topic %r deleted (%d consumer groups' offsets dropped)", note.topic, groups)
                self.held_replies.append(relay)
                return
        out.append(relay)

    def serve(self, origin: Origin, raw: bytes, out: Effects, peer_ip: bytes = b"", peer_key: str = "") -> None:
        """``peer_ip``: the client's IP (4 or 16 bytes), the born host of what it sends; b"" when
        it has none (ipc://, an actor on the internal port). ``peer_key``: its CURVE key ("" if none)."""
        try:
            self.route(origin, raw, out, peer_ip, peer_key)
        except RequestError as exc:
            if exc.code == ErrorCode.TOPIC_NOT_FOUND and self.config.elected:
                exc = self.served_elsewhere(exc, raw)
            out.append(self.error_reply(origin, raw, exc))

    def authorize(self, envelope: Envelope, peer_ip: bytes, peer_key: str) -> None:
        """RequestError (UNAUTHENTICATED, FORBIDDEN) unless the user of ``peer_key`` may do the request."""
        assert self.guard is not None
        acl = self.guard.acl()
        user = acl.by_curve_key.get(peer_key) if acl is not None else None
        checks = checks_of(envelope.op, envelope.topic, envelope.group, self.config.cluster_name)
        source = ip_text(peer_ip)
        self.requester = (user or "", source)
        refusal = self.guard.check(user, checks, source=source, op=envelope.op, unknown=peer_key)
        if refusal is not None:
            code = ErrorCode.UNAUTHENTICATED if refusal.code == "UNAUTHENTICATED" else ErrorCode.FORBIDDEN
            details = {"resource": refusal.resource, "action": refusal.action} if refusal.resource else {}
            raise RequestError(code, refusal.message, **details)
        if envelope.op in AUDITED_OPS and not self.routing_held:  # an administrative act allowed: who, from where
            self.guard.audit.record("admin", op=envelope.op, subject=user or "", source=source,
                                    resource=f"topic:{envelope.topic or ''}", action=checks[0].action)

    def served_elsewhere(self, exc: RequestError, raw: bytes) -> RequestError:
        """TOPIC_NOT_FOUND for a topic other broker sets of the cluster serve: the refusal names them."""
        topic = decode_envelope(raw).topic
        serving = self.routes.serving(topic) if topic else {}
        serving.pop(self.config.broker_name, None)
        if not serving:
            return exc
        where = ", ".join(f"{name} ({route['master_endpoint'] or 'electing its master'})"
                          for name, route in serving.items())
        return RequestError(ErrorCode.TOPIC_NOT_FOUND, f"topic {topic!r} is not on broker set "
                                                       f"{self.config.broker_name!r}; it is served by {where}",
                            brokers=",".join(serving),
                            master_endpoints=",".join(str(route["master_endpoint"]) for route in serving.values()))

    @staticmethod
    def error_reply(origin: Origin, raw: bytes, exc: RequestError) -> Reply:
        return Reply(origin, encode_error(safe_request_id(raw), exc.code, exc.message, **exc.details))

    def master_endpoint(self) -> str:
        """On a replica: the endpoint its master's clients reach, as its master last said ("" until then)."""
        try:
            return (self.env.run_dir / MASTER_ENDPOINT_FILE).read_text()
        except FileNotFoundError:
            return ""

    def broker_route(self) -> dict[str, object]:
        """The ``route`` reply: this engine's place in its broker set and where the master is."""
        cfg = self.config
        own = cfg.advertised_endpoint
        answer: dict[str, object] = {"cluster_name": cfg.cluster_name, "broker_name": cfg.broker_name,
                                     "broker_id": cfg.broker_id, "endpoint": own, "elected": cfg.elected,
                                     "reply_endpoints": self.reply_endpoints(), "send_endpoint": self.send_endpoint()}
        role = Role.load(self.env.run_dir) if cfg.elected else None
        if role is not None:
            master = own if role.is_master else role.master_endpoint
            # Elected but its actors not yet started again as master: it still serves as a replica.
            serving = "replica" if cfg.is_replica else role.role
            return {**answer, "role": serving, "epoch": role.epoch, "master_id": role.master_id,
                    "master_endpoint": master}
        master = self.master_endpoint() if cfg.is_replica else own
        return {**answer, "role": "replica" if cfg.is_replica else "master", "epoch": 0, "master_id": -1,
                "master_endpoint": master}

    def reply_endpoints(self) -> list[str]:
        """Where the actors that answer clients directly listen (``engine/ipc/direct_replies.py``)."""
        if not self.config.direct_replies_enabled:
            return []
        actors = ["writer", *(f"owner-{k}" for k in range(self.owner_count))]
        return direct_replies.advertised(self.config.endpoint, self.config.store_host, self.env.run_dir, actors)

    def send_endpoint(self) -> str:
        """Where the writer takes sends straight from clients (``direct_sends_enabled``); "" when it
        takes none: every request is checked here (``acl_enabled``), or this engine is a replica."""
        cfg = self.config
        if not (cfg.direct_replies_enabled and cfg.direct_sends_enabled) or cfg.acl_enabled or cfg.is_replica:
            return ""
        found = direct_replies.advertised(cfg.endpoint, cfg.store_host, self.env.run_dir, ["writer"])
        return found[0] if found else ""

    def topic_route(self, topic: str) -> list[dict[str, object]]:
        """The broker sets serving ``topic``: the cluster's routes, this engine's own table for its set."""
        serving: dict[str, dict[str, object]] = dict(self.routes.serving(topic))
        config = self.topics.get(topic)
        serving.pop(self.config.broker_name, None)
        if config is not None:
            own = self.broker_route()
            grpc = self.routes.grpc_endpoint(self.config.broker_name) or (
                self.config.grpc_endpoint if self.config.grpc_enabled and own["role"] == "master" else "")
            serving[self.config.broker_name] = {"queues": config.write_queue_nums,
                                                "master_endpoint": own["master_endpoint"], "grpc_endpoint": grpc}
        return [{"broker_name": name, **route} for name, route in sorted(serving.items())]

    def route(self, origin: Origin, raw: bytes, out: Effects, peer_ip: bytes = b"", peer_key: str = "") -> None:
        """The routing table: which actor serves each op (or the front itself)."""
        envelope = decode_envelope(raw)
        op = envelope.op
        self.figures.routed(op)
        if self.guard is not None:
            self.requester = ("", "")  # who and from where, for the audit log: the checked client's
            if origin.channel is channels.CLIENTS and peer_key not in self.trusted_keys:
                self.authorize(envelope, peer_ip, peer_key)
        if op in _WRITES and self.config.is_replica:
            master = self.master_endpoint()
            where = f"its master at {master}" if master else f"its master (replication {self.config.replica_of})"
            raise RequestError(ErrorCode.NOT_MASTER, f"this engine is a replica: it serves reads; send {op} to "
                                                     f"{where}", master_endpoint=master)
        if op in _WRITES and self.config.elected and self.clock.mono_ms() > self.slots.get(LEASE_DEADLINE):
            master = self.master_endpoint()
            raise RequestError(ErrorCode.NOT_MASTER, f"this engine's lease as master is not renewed: it takes no "
                                                     f"{op}; send it to {master or 'the master etcd elects'}",
                               master_endpoint=master)
        if envelope.topic in self.topics.unsaved:  # its entry is not on disk yet: after the batch's write
            self.hold(origin, raw, peer_ip, peer_key)
            return
        if op in _TO_QUEUE_OWNER:
            owner = self.queue_owner(envelope)
            if op in _POP_OPS:
                self.groups.pop_group(envelope)
            out.append(self.forward(owner, origin, _TO_QUEUE_OWNER[op](), raw))
        elif op in _TO_RECORD_OWNER:
            owner_index = record_owner(op, raw, self.config.segment_size_bytes, self.owner_count)
            out.append(self.forward(self.owners[owner_index], origin, _TO_RECORD_OWNER[op](), raw))
        elif op in _TO_TRANSACTIONS:
            decode_request(op, raw)  # refused here if malformed: the actor gets only valid requests
            out.append(self.forward(channels.TRANSACTIONS, origin, _TO_TRANSACTIONS[op](), raw))
        elif op == "send":
            if self.topics.auto_create(envelope):
                self.hold(origin, raw, peer_ip, peer_key)
                return
            internal = origin.channel is channels.FRONT_INTERNAL
            self.topics.check_send(envelope, internal=internal)
            append = Append(self.topics.choose_queue(envelope), self.clock.mono_ms(), internal, peer_ip)
            out.append(self.forward(channels.WRITER, origin, append, raw))
        elif op == "pop":
            self.route_pop(origin, raw, envelope, out, peer_key)
        elif op in ("query_by_key", "query_by_keys"):
            self.topics.check_topic(envelope)
            visible_end = self.slots.visible_end(sync_flush=self.sync_flush,
                                                 sync_replication=self.config.reads_wait_for_replicas)
            answer = self.lookup.answer if op == "query_by_key" else self.lookup.answer_many
            out.append(Reply(origin, answer(raw, visible_end=visible_end, deletions=self.slots.get(TOPIC_DELETIONS))))
        elif op == "delete_topic":
            topic = self.topics.check_deletable(envelope)
            decode_request(op, raw)
            out.append(self.forward_deletion(topic, self.deletions.add(topic, origin, raw)))
        elif op == "create_topic":
            reply = self.topics.create_topic(envelope, raw)
            if reply is None:
                self.hold(origin, raw, peer_ip, peer_key)  # answered once the new entry is on disk
            else:
                out.append(Reply(origin, reply))
        else:  # list_topics, ping, commit_offset, fetch_offset, heartbeat, status, route
            out.append(Reply(origin, self.local(op, envelope, raw)))

    def route_pop(self, origin: Origin, raw: bytes, envelope: Envelope, out: Effects, peer_key: str = "") -> None:
        """To the owner of the pop's queue, or to the owners holding queues of the topic in turn.
        A group's first pop of a topic creates its dead-letter topic first."""
        topic = self.topics.check_topic(envelope)
        group = self.groups.pop_group(envelope)
        if self.topics.create_dead_letter_topic(dead_letter_topic(group)):
            self.hold(origin, raw, b"", peer_key)  # forwarded once the dead-letter topic is on disk
            return
        self.groups.popped(group, topic)
        if envelope.queue_id is not None:
            owner = self.queue_owner(envelope)  # checks the queue id
            out.append(self.forward(owner, origin, Pop([envelope.queue_id]), raw))
            return
        config = self.topics.get(topic)
        assert config is not None
        out.append(self.pop_at(origin, raw, self.pop_fan_out.order(topic, config.read_queue_nums)))

    def pop_at(self, origin: Origin, raw: bytes, order: PopOrder) -> Tell:
        """The pop for the first owner of ``order``; it hands the pop back if it has nothing now and
        others are left, so every owner's queues are looked at before one waits (long polling)."""
        (owner, queue_ids), *then = order
        return self.forward(self.owners[owner], origin, Pop(queue_ids, then), raw)

    def queue_owner(self, envelope: Envelope) -> Channel:
        """The channel of the owner of the request's (topic, queue), once both are checked."""
        queue_id = self.topics.check_queue(envelope)
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
        self.figures.refused(refusal.code)
        return self.error_reply(origin, raw, refusal)

    def local(self, op: str, envelope: Envelope, raw: bytes) -> bytes:
        """The reply to an op the front answers from its own state."""
        request = decode_request(op, raw)
        if op == "list_topics":
            return self.topics.listing(envelope.id)
        if op == "ping":
            return encode_reply(envelope.id, pong=True)
        if isinstance(request, RouteRequest):
            if request.topic is None:
                return encode_reply(envelope.id, **self.broker_route())
            return encode_reply(envelope.id, **self.broker_route(), topic_route=self.topic_route(request.topic))
        if isinstance(request, CommitOffsetRequest | FetchOffsetRequest | HeartbeatRequest):
            return self.group_reply(request, envelope)
        assert op == "status"
        return self.figures.status(envelope.id, self.slots, owner_count=self.owner_count,
                                   topic_count=len(self.topics.table.topics), flush_mode=self.config.flush_mode)

    def group_reply(self, request: CommitOffsetRequest | FetchOffsetRequest | HeartbeatRequest,
                    envelope: Envelope) -> bytes:
        """A consumer group's offsets, or its membership (a heartbeat)."""
        if isinstance(request, HeartbeatRequest):
            config = self.topics.get(self.topics.check_topic(envelope))
            assert config is not None
            return self.groups.heartbeat(request, self.clock.mono_ms(), config.read_queue_nums)
        self.topics.check_queue(envelope)
        if isinstance(request, CommitOffsetRequest):
            before = self.groups.offsets.fetch(request.group, request.topic, request.queue_id) \
                if self.guard is not None else -1  # looked up only where the audit log is kept
            reply = self.groups.commit(request)
            if self.guard is not None and 0 <= request.offset < before:  # a group moved back: an admin's act
                subject, source = self.requester
                self.guard.audit.record("admin", op="offset reset", subject=subject, source=source,
                                        resource=f"group:{request.group}", topic=request.topic,
                                        queue_id=request.queue_id, offset_from=before, offset_to=request.offset)
            return reply
        return self.groups.fetch(request)

    def tick(self, out: Effects) -> None:
        now_ms = self.clock.mono_ms()
        if self.deletions.send_again_due:
            for topic, pending in self.deletions.to_send_again():
                out.append(self.forward_deletion(topic, pending, self.deletions.send_again_refused))
        self.drained(channels.CLIENTS, out)  # a held request that changed the table again
        log_min = self.slots.get(MIN_OFFSET)
        if log_min > self.log_min_offset:  # retention deleted segments: let their mappings go
            self.log_min_offset = log_min
            self.lookup.after_retention()
        self.groups.persist_due(now_ms)
        self.groups.expire_members_due(now_ms)
        if self.shipped is not None and self.shipped.changed():  # a replica: its master's files came
            self.topics = TopicRules(self.env.store_dir, self.config, self.deletions)
            self.groups = ConsumerGroups(self.env.store_dir, self.config, self.clock.mono_ms())
            self.publish_routes()

    def shutdown(self, out: Effects) -> None:
        self.groups.persist()
        self.lookup.close()

    def detail(self) -> dict[str, int]:
        return {"requests": self.figures.requests_served, "topics": len(self.topics.table.topics),
                "disk_refusals": self.topics.writes.count, **(self.guard.detail() if self.guard else {})}

    def condition(self) -> str:
        return "" if not self.topics.writes.refusing else f"cannot save the topic table: {self.topics.writes.reason}"

    def metrics(self) -> Figures:
        return {**self.figures.rows(), "rmqpy_group_committed_offset": self.groups.committed_rows(),
                "rmqpy_group_members": [[group, topic, count] for (group, topic), count
                                        in self.groups.members.member_counts().items()]}


if __name__ == "__main__":
    raise SystemExit(main(FrontActor))
