"""``apache.rocketmq.v2.MessagingService`` served from the engine: each call becomes requests of
the client protocol to the front (``EngineLink``), each answer a response with the API's status.

What each call does here (RocketMQ's proxy is the model; docs/grpc.md has the table):

* ``QueryRoute``: the topic's queues, all on one broker, this endpoint. An unknown topic is
  created when ``auto_create_topic`` is on (RocketMQ's ``autoCreateTopicEnable``), otherwise
  TOPIC_NOT_FOUND. In a cluster of broker sets (docs/cluster.md) the queues of every set that
  serves the topic, each set a broker with its master's gRPC endpoint (the cluster's routes, as
  the front mirrors them): the official clients send to and receive from every set.
* ``SendMessage``: one engine ``send``; a message group is the sharding key, so one group
  keeps to one queue. The message id is the one the client made (stored as UNIQ_KEY).
* ``QueryAssignment``: one assignment per broker with queue id -1 (all queues), as the proxy
  gives non-FIFO push consumers; in a cluster, one per broker set serving the topic.
* ``ReceiveMessage``: pops of the group on the topic's queues (the queue id of the request is
  not binding, as in the proxy), long polling up to the client's ``long_polling_timeout``.
* ``AckMessage``, ``ChangeInvisibleDuration``: the engine's ``ack`` and ``change_invisible``.
* ``Telemetry``: answers each settings command with the server's settings (``settings.py``).
* ``Heartbeat``, ``NotifyClientTermination``: OK; the engine keeps no per-client state.
* ``ForwardMessageToDeadLetterQueue`` (FIFO push consumers, after their local retries): the
  engine's ``ack`` with ``dead_letter``.
* Groups of ``fifo_groups`` consume in order: the owners give a queue's next message only once
  the earlier ones are acked; such consumers are told ``fifo`` in their settings.
* Delay messages (``delivery_timestamp``): the send's ``deliver_at_ms``; transactional ones: a
  transactional send whose producer group is the topic (as in the proxy); ``EndTransaction``:
  the engine's ``end_transaction``. A producer's telemetry stream carries the checks of its
  topics' half messages (``RecoverOrphanedTransactionCommand``).
* Lite and priority messages, ``RecallMessage``: UNSUPPORTED; the offset calls of the pull consumer
  (``PullMessage``, ``GetOffset`` …): gRPC's own UNIMPLEMENTED.
* With ``acl_enabled`` (``guard``) every call is first checked as RocketMQ's proxy checks it: its
  signature (``engine/security/signature.py``) names the user, whose policies must allow what the
  call does (a route: pub or sub on the topic; a send: pub; a receive, an ack, an assignment: sub
  on the topic and the group); UNAUTHORIZED or FORBIDDEN otherwise, audited, and the engine is not
  asked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from rocketmq.grpc_protocol import (
    AddressScheme,
    Code,
    FilterType,
    MessageType,
    Permission,
    TransactionResolution,
    definition_pb2,
    service_pb2,
    service_pb2_grpc,
)

from engine.client import ClientError, popped_messages
from engine.config import StoreConfig
from engine.errors import RequestError
from engine.gateway import settings
from engine.gateway.codes import error_status, put_status, status
from engine.gateway.link import EngineLink
from engine.gateway.messages import Refused, duration_ms, incoming, outgoing, timestamp
from engine.names import validate_group
from engine.security.acl import Check, Refusal
from engine.security.guard import Guard
from engine.security.signature import DATE_HEADER, verify
from engine.store.records import owner_of

log = logging.getLogger(__name__)

Response = TypeVar("Response")

_TOPIC_CACHE_MS = 1000  # how long a topic's queue count is trusted before asking again
_RECEIVE_SLICE_MS = 200  # a long poll's turn on one owner when the topic spans several
_DEADLINE_MARGIN_MS = 300  # answer this long before the client's deadline
_CHECKS_WAIT_MS = 1_000  # a producer stream's long poll for transaction checks, per topic
_DECISIONS = {int(TransactionResolution.COMMIT): "commit", int(TransactionResolution.ROLLBACK): "rollback"}
_ACCEPTED_TYPES = (MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION)


class MessagingService(service_pb2_grpc.MessagingServiceServicer):  # type: ignore[misc]  # rocketmq ships no stubs
    def __init__(self, link: EngineLink, config: StoreConfig, broker: definition_pb2.Broker,
                 master_broker: Callable[[], definition_pb2.Broker | None] = lambda: None,
                 guard: Guard | None = None) -> None:
        """``master_broker``: elected on etcd, the broker set's master when it is another engine (the
        routes name it: clients send there); None while this engine is master or not elected.
        ``guard``: the ACL every call is checked against (None: every call is served)."""
        self.guard = guard
        self.link = link
        self.config = config
        self.broker = broker
        self.master_broker = master_broker
        self.queue_counts: dict[str, tuple[int, float]] = {}  # topic -> (queue count, when learnt)
        self.calls = 0

    # -- helpers -----------------------------------------------------------------------------

    async def answer(self, make: Callable[..., Response],
                     work: Callable[[], Awaitable[dict[str, Any] | Response]]) -> Response:
        """``make(status=..., **fields of work())`` (or what work() built whole); a refusal or an
        engine error becomes the status."""
        self.calls += 1
        try:
            fields = await work()
        except (Refused, ClientError) as exc:
            return make(status=refusal_status(exc))
        if not isinstance(fields, dict):
            return fields  # the response, built whole by the method
        return make(status=fields.pop("status", None) or status(), **fields)

    def authorize(self, context: grpc.aio.ServicerContext, op: str, *checks: Check) -> None:
        """Refused (UNAUTHORIZED, FORBIDDEN) unless the call is signed by a user who may do ``checks``."""
        guard = self.guard
        if guard is None:
            return
        source = peer_address(context.peer())
        metadata = dict(context.invocation_metadata() or ())
        acl = guard.acl()
        user = None
        if "authorization" not in metadata and acl is not None:  # mutual TLS: the certificate's name
            names = (context.auth_context() or {}).get("x509_common_name") or ()
            user = acl.by_tls_name.get(names[0].decode()) if names else None
        if user is None:
            signed = verify(str(metadata.get("authorization", "")), str(metadata.get(DATE_HEADER, "")),
                            acl.secret_of if acl is not None else lambda _key: None,
                            now_ms=time.time_ns() // 1_000_000, skew_ms_max=self.config.acl_signature_skew_ms_max)
            if signed.user is None:
                guard.refuse(Refusal("UNAUTHENTICATED", signed.reason), user=None, source=source, op=op)
                raise Refused(Code.UNAUTHORIZED, f"UNAUTHENTICATED: {signed.reason}")
            user = signed.user
        refusal = guard.check(user, checks, source=source, op=op)
        if refusal is not None:
            raise Refused(Code.UNAUTHORIZED if refusal.code == "UNAUTHENTICATED" else Code.FORBIDDEN,
                          f"{refusal.code}: {refusal.message}")

    def deadline_ms(self, context: grpc.aio.ServicerContext) -> int:
        remaining = context.time_remaining()
        timeout = self.config.grpc_request_timeout_ms
        return timeout if remaining is None else max(1, min(timeout, int(remaining * 1000) - _DEADLINE_MARGIN_MS))

    async def queue_count(self, topic: str, *, create: bool) -> int:
        if not topic:
            raise Refused(Code.ILLEGAL_TOPIC, "the topic name is empty")
        known = self.queue_counts.get(topic)
        if known is not None and time.monotonic() - known[1] < _TOPIC_CACHE_MS / 1000:
            return known[0]
        reply = await self.link.request("list_topics")
        counts: dict[str, int] = {entry["topic"]: entry["queue_count"] for entry in reply["topics"]}
        count = counts.get(topic)
        if count is None:
            if not (create and self.config.auto_create_topic):
                raise Refused(Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
            count = (await self.link.request("create_topic", topic=topic))["queue_count"]
        self.queue_counts[topic] = (count, time.monotonic())
        return count

    def queue(self, topic: str, queue_id: int, broker: definition_pb2.Broker | None = None) \
            -> definition_pb2.MessageQueue:
        """A queue of this broker set (its master's endpoint), or of ``broker``, another set of the cluster."""
        return definition_pb2.MessageQueue(topic=definition_pb2.Resource(name=topic), id=queue_id,
                                           permission=Permission.READ_WRITE,
                                           broker=broker or self.master_broker() or self.broker,
                                           accept_message_types=_ACCEPTED_TYPES)

    # -- routes and sessions -------------------------------------------------------------------

    async def QueryRoute(self, request: service_pb2.QueryRouteRequest, context: grpc.aio.ServicerContext) \
            -> service_pb2.QueryRouteResponse:
        async def work() -> dict[str, Any]:
            topic = request.topic.name
            self.authorize(context, "QueryRoute", Check("topic", topic, "pub|sub"))
            others = await self.other_sets(topic)
            queues = [] if others and not await self.served_here(topic) else \
                [self.queue(topic, q) for q in range(await self.queue_count(topic, create=True))]
            for broker, count in others:
                queues += [self.queue(topic, q, broker) for q in range(count)]
            return {"message_queues": queues}
        return await self.answer(service_pb2.QueryRouteResponse, work)

    async def QueryAssignment(self, request: service_pb2.QueryAssignmentRequest,
                              context: grpc.aio.ServicerContext) -> service_pb2.QueryAssignmentResponse:
        async def work() -> dict[str, Any]:
            group = check_group(request.group.name)
            topic = request.topic.name
            self.authorize(context, "QueryAssignment", Check("topic", topic, "sub"), Check("group", group, "sub"))
            others = await self.other_sets(topic)
            here = [] if others and not await self.served_here(topic) else [self.queue(topic, -1)]
            if not others:
                await self.queue_count(topic, create=False)
            return {"assignments": [definition_pb2.Assignment(message_queue=queue) for queue in
                                    here + [self.queue(topic, -1, broker) for broker, _count in others]]}
        return await self.answer(service_pb2.QueryAssignmentResponse, work)

    async def other_sets(self, topic: str) -> list[tuple[definition_pb2.Broker, int]]:
        """In a cluster of broker sets, the other sets serving ``topic`` that have a gRPC endpoint:
        (their broker, queue count). [] for an engine not elected on etcd."""
        if not self.config.elected or not topic:
            return []
        reply = await self.link.request("route", topic=topic)
        return [(grpc_broker(entry["broker_name"], entry["grpc_endpoint"]), entry["queues"])
                for entry in reply["topic_route"]
                if entry["broker_name"] != self.config.broker_name and entry["grpc_endpoint"]]

    async def served_here(self, topic: str) -> bool:
        try:
            await self.queue_count(topic, create=False)
        except Refused:
            return False
        return True

    async def Heartbeat(self, request: service_pb2.HeartbeatRequest, context: grpc.aio.ServicerContext) \
            -> service_pb2.HeartbeatResponse:
        async def work() -> dict[str, Any]:
            if request.HasField("group"):
                self.authorize(context, "Heartbeat", Check("group", check_group(request.group.name), "pub|sub"))
            else:
                self.authorize(context, "Heartbeat")
            return {}
        return await self.answer(service_pb2.HeartbeatResponse, work)

    async def NotifyClientTermination(self, request: service_pb2.NotifyClientTerminationRequest,
                                      context: grpc.aio.ServicerContext) -> service_pb2.NotifyClientTerminationResponse:
        async def work() -> dict[str, Any]:
            self.authorize(context, "NotifyClientTermination")
            return {}
        return await self.answer(service_pb2.NotifyClientTerminationResponse, work)

    async def Telemetry(self, request_iterator: AsyncIterator[service_pb2.TelemetryCommand],
                        context: grpc.aio.ServicerContext) -> AsyncIterator[service_pb2.TelemetryCommand]:
        commands: asyncio.Queue[service_pb2.TelemetryCommand | None] = asyncio.Queue()
        checks: list[asyncio.Task[None]] = []
        try:
            self.authorize(context, "Telemetry")
        except Refused as exc:
            yield service_pb2.TelemetryCommand(status=status(exc.code, exc.message))
            return

        async def read() -> None:
            async for command in request_iterator:
                self.calls += 1
                if command.HasField("settings"):
                    await commands.put(service_pb2.TelemetryCommand(
                        status=status(), settings=settings.answer(command.settings, self.config)))
                    topics = [topic.name for topic in command.settings.publishing.topics]
                    if topics and not checks:  # a producer: it answers the checks of its topics' halves
                        checks.append(asyncio.create_task(self.offer_checks(topics, commands)))
                # thread stack traces and message verification results answer commands never sent
            await commands.put(None)

        reader = asyncio.create_task(read())
        try:
            while (command := await commands.get()) is not None:
                yield command
        finally:
            for task in (reader, *checks):
                task.cancel()

    async def offer_checks(self, topics: list[str], commands: asyncio.Queue[Any]) -> None:
        """RocketMQ's orphaned-transaction recovery: each half message of these topics that waits for
        a decision goes to this producer's stream; its checker answers with EndTransaction."""
        while True:
            for topic in topics:
                try:
                    reply = await self.link.request("transaction_checks", producer_group=topic,
                                                    max_wait_ms=_CHECKS_WAIT_MS,
                                                    timeout_ms=_CHECKS_WAIT_MS + self.config.grpc_request_timeout_ms)
                except ClientError as exc:
                    log.warning("transaction checks of %r: %s", topic, exc)
                    await asyncio.sleep(_CHECKS_WAIT_MS / 1000)  # the engine is restarting: ask again later
                    continue
                for check in reply["checks"]:
                    await commands.put(service_pb2.TelemetryCommand(
                        recover_orphaned_transaction_command=service_pb2.RecoverOrphanedTransactionCommand(
                            message=incoming(check), transaction_id=check["msg_id"])))

    # -- producers ---------------------------------------------------------------------------

    async def SendMessage(self, request: service_pb2.SendMessageRequest, context: grpc.aio.ServicerContext) \
            -> service_pb2.SendMessageResponse:
        async def work() -> service_pb2.SendMessageResponse:
            sending = outgoing(request.messages, body_bytes_max=self.config.message_body_bytes_max)
            self.authorize(context, "SendMessage", Check("topic", sending.topic, "pub"))
            fields: dict[str, Any] = {"topic": sending.topic, "messages": sending.messages}
            if sending.group is not None:
                fields["sharding_key"] = sending.group
            if sending.deliver_at_ms is not None:
                fields["deliver_at_ms"] = sending.deliver_at_ms
            if sending.transactional:  # the topic names the producers, as in RocketMQ's proxy
                fields.update(transaction=True, producer_group=sending.topic)
            reply = await self.link.request("send", timeout_ms=self.deadline_ms(context), **fields)
            response = service_pb2.SendMessageResponse()
            for message, result in zip(sending.messages, reply["results"], strict=True):
                entry = response.entries.add(message_id=message["properties"]["UNIQ_KEY"],
                                             offset=result["queue_offset"])
                if sending.transactional:
                    entry.transaction_id = result["msg_id"]  # the half message, which EndTransaction names
                entry.status.CopyFrom(put_status(result["status_code"], result["status"]))
            response.status.CopyFrom(response.entries[0].status)
            return response
        return await self.answer(service_pb2.SendMessageResponse, work)

    async def EndTransaction(self, request: service_pb2.EndTransactionRequest, context: grpc.aio.ServicerContext) \
            -> service_pb2.EndTransactionResponse:
        async def work() -> dict[str, Any]:
            self.authorize(context, "EndTransaction", Check("topic", request.topic.name, "pub"))
            if request.resolution not in _DECISIONS:
                raise Refused(Code.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK")
            await self.link.request("end_transaction", timeout_ms=self.deadline_ms(context),
                                    msg_id=request.transaction_id, decision=_DECISIONS[request.resolution],
                                    producer_group=request.topic.name)
            return {}
        return await self.answer(service_pb2.EndTransactionResponse, work)

    async def RecallMessage(self, request: service_pb2.RecallMessageRequest, context: grpc.aio.ServicerContext) \
            -> service_pb2.RecallMessageResponse:
        return service_pb2.RecallMessageResponse(
            status=status(Code.UNSUPPORTED, "a delay message cannot be recalled here: it is delivered at its time"))

    # -- consumers ---------------------------------------------------------------------------

    async def ReceiveMessage(self, request: service_pb2.ReceiveMessageRequest, context: grpc.aio.ServicerContext) \
            -> AsyncIterator[service_pb2.ReceiveMessageResponse]:
        self.calls += 1
        try:
            invisible_ms, messages = await self.receive(request, context)
        except (Refused, ClientError) as exc:
            yield service_pb2.ReceiveMessageResponse(status=refusal_status(exc))
            return
        if not messages:
            yield service_pb2.ReceiveMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
            return
        yield service_pb2.ReceiveMessageResponse(status=status())
        for message in messages:
            yield service_pb2.ReceiveMessageResponse(message=incoming(message, invisible_ms=invisible_ms))
        yield service_pb2.ReceiveMessageResponse(delivery_timestamp=timestamp(time.time_ns() // 1_000_000))

    async def receive(self, request: service_pb2.ReceiveMessageRequest, context: grpc.aio.ServicerContext) \
            -> tuple[int, list[dict[str, Any]]]:
        group = check_group(request.group.name)
        topic = request.message_queue.topic.name
        self.authorize(context, "ReceiveMessage", Check("topic", topic, "sub"), Check("group", group, "sub"))
        count = await self.queue_count(topic, create=False)
        subscription = "*"
        if request.HasField("filter_expression"):
            if request.filter_expression.type == FilterType.SQL:
                raise Refused(Code.UNSUPPORTED, "SQL92 filters are not supported; use a tag expression")
            subscription = request.filter_expression.expression.strip() or "*"
        if request.batch_size < 1:
            raise Refused(Code.BAD_REQUEST, "batch_size must be at least 1")
        if request.HasField("invisible_duration"):
            invisible_ms = duration_ms(request.invisible_duration)
        elif request.auto_renew:
            invisible_ms = self.config.grpc_invisible_ms_default
        else:
            raise Refused(Code.ILLEGAL_INVISIBLE_TIME, "invisible_duration is required without auto_renew")
        if not 1000 <= invisible_ms <= self.config.pop_invisible_ms_max:
            raise Refused(Code.ILLEGAL_INVISIBLE_TIME,
                          f"invisible_duration must be between 1 s and {self.config.pop_invisible_ms_max} ms")
        wait_ms = duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0
        wait_ms = max(0, min(wait_ms, self.config.long_poll_wait_ms_max, self.deadline_ms(context) - 1))
        owners = len({owner_of(topic, q, self.config.consume_queue_owner_count) for q in range(count)})
        fields = {"group": group, "topic": topic, "max_messages": min(request.batch_size, 1024),
                  "invisible_ms": invisible_ms, "subscription": subscription}
        deadline = time.monotonic() + wait_ms / 1000
        for _ in range(owners):  # each pop without a queue goes to the next owner of the topic's queues
            reply = await self.link.request("pop", **fields)
            if reply["messages"]:
                return invisible_ms, popped_messages(reply)
        while (remaining_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            wait = remaining_ms if owners == 1 else min(remaining_ms, _RECEIVE_SLICE_MS)
            reply = await self.link.request("pop", max_wait_ms=wait,
                                            timeout_ms=self.config.grpc_request_timeout_ms + wait, **fields)
            if reply["messages"]:
                return invisible_ms, popped_messages(reply)
        return invisible_ms, []

    async def AckMessage(self, request: service_pb2.AckMessageRequest, context: grpc.aio.ServicerContext) \
            -> service_pb2.AckMessageResponse:
        async def work() -> dict[str, Any]:
            group = check_group(request.group.name)
            self.authorize(context, "AckMessage", Check("topic", request.topic.name, "sub"),
                           Check("group", group, "sub"))
            by_queue: dict[int, list[service_pb2.AckMessageEntry]] = {}
            entries = []
            for entry in request.entries:
                queue_id = handle_queue(entry.receipt_handle)
                if queue_id is None:
                    entries.append(ack_result(entry, status(Code.INVALID_RECEIPT_HANDLE,
                                                            f"{entry.receipt_handle!r} is not a receipt handle")))
                else:
                    by_queue.setdefault(queue_id, []).append(entry)
            for queue_id, queued in by_queue.items():
                reply = await self.link.request("ack", group=group, topic=request.topic.name, queue_id=queue_id,
                                                receipt_handles=[e.receipt_handle for e in queued],
                                                timeout_ms=self.deadline_ms(context))
                failed = {f["receipt_handle"]: f["error"] for f in reply["failed"]}
                for entry in queued:
                    error = failed.get(entry.receipt_handle)
                    entries.append(ack_result(entry, status() if error is None else
                                              status(Code.INVALID_RECEIPT_HANDLE, error["message"])))
            if not entries:
                raise Refused(Code.BAD_REQUEST, "an AckMessageRequest needs at least one entry")
            codes = {e.status.code for e in entries}
            overall = entries[0].status if len(codes) == 1 else status(Code.MULTIPLE_RESULTS, "see the entries")
            return {"status": overall, "entries": entries}
        return await self.answer(service_pb2.AckMessageResponse, work)

    async def ChangeInvisibleDuration(self, request: service_pb2.ChangeInvisibleDurationRequest,
                                      context: grpc.aio.ServicerContext) \
            -> service_pb2.ChangeInvisibleDurationResponse:
        async def work() -> dict[str, Any]:
            group = check_group(request.group.name)
            self.authorize(context, "ChangeInvisibleDuration", Check("topic", request.topic.name, "sub"),
                           Check("group", group, "sub"))
            queue_id = required_handle_queue(request.receipt_handle)
            invisible_ms = duration_ms(request.invisible_duration)
            if not 0 <= invisible_ms <= self.config.pop_invisible_ms_max:
                raise Refused(Code.ILLEGAL_INVISIBLE_TIME,
                              f"invisible_duration must be between 0 and {self.config.pop_invisible_ms_max} ms")
            reply = await self.link.request("change_invisible", group=group, topic=request.topic.name,
                                            queue_id=queue_id, receipt_handle=request.receipt_handle,
                                            invisible_ms=invisible_ms, timeout_ms=self.deadline_ms(context))
            return {"receipt_handle": reply["receipt_handle"]}
        return await self.answer(service_pb2.ChangeInvisibleDurationResponse, work)

    async def ForwardMessageToDeadLetterQueue(self, request: service_pb2.ForwardMessageToDeadLetterQueueRequest,
                                              context: grpc.aio.ServicerContext) \
            -> service_pb2.ForwardMessageToDeadLetterQueueResponse:
        """A FIFO push consumer gave up on a message after its local retries: the engine's ``ack``
        with ``dead_letter`` moves it to %DLQ%{group} now."""
        async def work() -> dict[str, Any]:
            group = check_group(request.group.name)
            self.authorize(context, "ForwardMessageToDeadLetterQueue", Check("topic", request.topic.name, "sub"),
                           Check("group", group, "sub"))
            queue_id = required_handle_queue(request.receipt_handle)
            reply = await self.link.request("ack", group=group, topic=request.topic.name, queue_id=queue_id,
                                            receipt_handles=[request.receipt_handle], dead_letter=True,
                                            timeout_ms=self.deadline_ms(context))
            if reply["failed"]:
                raise Refused(Code.INVALID_RECEIPT_HANDLE, reply["failed"][0]["error"]["message"])
            return {}
        return await self.answer(service_pb2.ForwardMessageToDeadLetterQueueResponse, work)


def grpc_broker(name: str, grpc_endpoint: str) -> definition_pb2.Broker:
    """The broker of a set whose master serves gRPC at ``grpc_endpoint`` (host:port); id 0, a master."""
    host, _, port = grpc_endpoint.rpartition(":")
    return definition_pb2.Broker(name=name, id=0, endpoints=definition_pb2.Endpoints(
        scheme=AddressScheme.IPv6 if ":" in host else AddressScheme.IPv4,
        addresses=[definition_pb2.Address(host=host.strip("[]"), port=int(port))]))


def peer_address(peer: str) -> str:
    """The IP address of gRPC's ``context.peer()`` ("ipv4:10.1.2.3:5000", "ipv6:[::1]:5000"); "" if none."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]").replace("%5B", "").replace("%5D", "")
    return ""


def check_group(name: str) -> str:
    try:
        return validate_group(name)
    except RequestError as exc:
        raise Refused(Code.ILLEGAL_CONSUMER_GROUP, exc.message) from None


def refusal_status(exc: Refused | ClientError) -> definition_pb2.Status:
    """The status of a request refused here or by the engine, or not answered in time."""
    return status(exc.code, exc.message) if isinstance(exc, Refused) else error_status(exc)


def handle_queue(handle: str) -> int | None:
    """The queue id a receipt handle names (``docs/protocol.md`` 4.12), None if it is not one."""
    head, _, rest = handle.partition(":")
    return int(head) if head.isdigit() and len(head) < 6 and rest else None


def required_handle_queue(handle: str) -> int:
    queue_id = handle_queue(handle)
    if queue_id is None:
        raise Refused(Code.INVALID_RECEIPT_HANDLE, f"{handle!r} is not a receipt handle")
    return queue_id


def ack_result(entry: service_pb2.AckMessageEntry, result: definition_pb2.Status) \
        -> service_pb2.AckMessageResultEntry:
    return service_pb2.AckMessageResultEntry(message_id=entry.message_id, receipt_handle=entry.receipt_handle,
                                             status=result)

