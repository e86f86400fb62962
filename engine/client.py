"""The Python client: the protocol of ``docs/protocol.md`` over one ZeroMQ socket.

    from engine.client import StoreClient

    with StoreClient("tcp://127.0.0.1:10911") as client:
        client.create_topic("orders", queue_count=4)
        [result] = client.send("orders", [{"body": b"hello", "keys": ["order-1"], "tags": "new"}])
        reply = client.pull("orders", result["queue_id"], result["queue_offset"], max_wait_ms=5_000)
        found = client.query_by_key("orders", "order-1")

A message is readable once dispatched to its queue, a few ms after the send's reply: the pull
above waits for it (``max_wait_ms``), where one without a wait may find nothing yet.

Every call has a deadline (``timeout_ms``); a reply that does not come in
time raises ``RequestTimeout``. A request past the protocol's frame limit
(``FRAME_BYTES_MAX``) is refused before it is sent, with ``MESSAGE_ILLEGAL``.
A refused request raises ``EngineError`` carrying the engine's stable error
``code`` and ``name``.

The socket is a ROUTER that gives the front a routing id of its own (random, a new one for each
socket): with it, the actors that make the answers (the writer for a send, an owner for a pull)
answer the client directly, past the front, once its socket is connected to them too
(``engine/ipc/direct_replies.py``). The client learns where they listen from the ``route``
answer it asks for beside its first request, and connects to them in the background; until then,
and whenever one is down, answers come through the front. Once connected to the writer's port
(the ``route`` answer's ``send_endpoint``), sends go straight there: the writer checks them as the
front would and answers, one engine process crossed instead of two; a send the writer does not
decide (a topic it does not know yet, say) comes back ROUTE_VIA_FRONT, nothing stored, and is sent
again to the front, unseen by the caller. ``direct_replies=False`` keeps to the front alone.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec
import zmq
import zmq.utils.monitor

from engine.errors import ErrorCode
from engine.ipc.curve import CurveKeys
from engine.ipc.endpoints import allow_ipv6
from engine.ipc.protocol import PROTOCOL_VERSION

DEFAULT_ENDPOINT = "tcp://127.0.0.1:10911"

# The protocol's size limits (docs/protocol.md 1.5 and 4.1), the engine's defaults of
# ``client_frame_bytes_max`` and ``message_body_bytes_max``. ZeroMQ drops a frame past the
# first without a word (``ZMQ_MAXMSGSIZE``): the client would wait out its whole deadline, so
# every client refuses such a request itself, with the code the engine gives a body too large.
FRAME_BYTES_MAX = 4 * 1024 * 1024 + 64 * 1024
MESSAGE_BODY_BYTES_MAX = 4 * 1024 * 1024
MESSAGE_ILLEGAL_CODE = 8  # engine.errors.ErrorCode.MESSAGE_ILLEGAL
CONNECT_PROBE_MS = 1_000  # how long engine_answers waits for a connection
# A watched connection (a broker set's client) sends ZMTP heartbeats: an engine that answers none for
# HEARTBEAT_TIMEOUT_MS (paused, or cut off by the network; its TCP connection stays up) is dropped as a
# broken one, and so is a new connection whose handshake takes as long (an engine paused before it).
HEARTBEAT_IVL_MS = 250
HEARTBEAT_TIMEOUT_MS = 1_000

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()

# The client's socket names its connection to the front so, and its direct ones d0, d1, ...
_FRONT = b"front"
_RECONNECT_IVL_MS = 10  # a restarted front is found within 10 ms (ZeroMQ's default: 100 ms)
_ROUTE_REQUEST_ID = 2**53  # the ``route`` asked beside the first request (ids count up from 1)


class ClientError(Exception):
    """Base of everything this client raises."""


class RequestTimeout(ClientError, TimeoutError):
    """No reply before the deadline: the engine may be down, busy, or may have dropped the frame."""


class ConnectionLost(RequestTimeout):
    """The connection broke while the reply was awaited (the engine's front died, or the network
    between): as after a timeout the request may or may not have been carried out, but the client
    knows at once (``StoreClient(watch_connection=True)``)."""


class EngineError(ClientError):
    """The engine refused the request; ``code`` and ``name`` are from ``engine.errors.ErrorCode``."""

    def __init__(self, code: int, name: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{name} ({code}): {message}")
        self.code = code
        self.name = name
        self.message = message
        self.details = details or {}


class FrameTooLarge(EngineError):
    """A request the engine could never take: its frame is past the protocol's limit. Raised by the
    client before sending, as ``MESSAGE_ILLEGAL`` (the code the engine gives a body too large)."""

    def __init__(self, op: str, frame_bytes: int, frame_bytes_max: int) -> None:
        super().__init__(MESSAGE_ILLEGAL_CODE, "MESSAGE_ILLEGAL",
                         f"the {op!r} request is {frame_bytes:,} bytes; the engine drops requests over "
                         f"{frame_bytes_max:,} bytes (client_frame_bytes_max) without a reply; a message body "
                         f"is at most {MESSAGE_BODY_BYTES_MAX:,} bytes (message_body_bytes_max): "
                         f"split the batch or make the body smaller",
                         {"frame_bytes": frame_bytes, "frame_bytes_max": frame_bytes_max})


class EngineUnreachable(ClientError, ConnectionError):
    """Nothing accepts a connection at the endpoint: no engine runs there."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(f"no engine answers on {endpoint} (is it running? `rmqpy-server status`)")
        self.endpoint = endpoint


def encode_request(op: str, request_id: int, fields: Mapping[str, Any], *,
                   frame_bytes_max: int = FRAME_BYTES_MAX) -> bytes:
    """One request frame; ``FrameTooLarge`` if it is past ``frame_bytes_max`` (never sent)."""
    frame = _encoder.encode({"v": PROTOCOL_VERSION, "op": op, "id": request_id, **fields})
    if len(frame) > frame_bytes_max:
        raise FrameTooLarge(op, len(frame), frame_bytes_max)
    return frame


def master_of_set(endpoints: list[str], *, timeout_ms: int = 2_000) -> str | None:
    """The master's endpoint as the first engine of a broker set that answers ``route`` names it
    (None: none answers, or none knows a master: an election under way)."""
    for endpoint in endpoints:
        if not engine_answers(endpoint):
            continue
        try:
            with StoreClient(endpoint, timeout_ms=timeout_ms, direct_replies=False) as client:
                route = client.route()
        except ClientError:
            continue
        master = route.get("master_endpoint")
        if isinstance(master, str) and master:
            return master
    return None


def engine_answers(endpoint: str, *, timeout_ms: int = CONNECT_PROBE_MS,
                   context: zmq.Context[zmq.Socket[bytes]] | None = None) -> bool:
    """True if a connection to ``endpoint`` is made within ``timeout_ms``; False as soon as one is
    refused (nothing listens there: a host's answer, or the socket file missing). A DEALER queues
    requests for an engine that is not there, so a client would learn that nothing runs only when
    its deadline passes; this asks the socket instead (a connection, not an answer: a busy engine
    that accepts connections passes, and its requests keep their whole deadline)."""
    context = context or zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED)
    try:
        allow_ipv6(sock, endpoint).connect(endpoint)
        if not monitor.poll(timeout_ms):
            return False
        return zmq.utils.monitor.recv_monitor_message(monitor)["event"] == zmq.EVENT_CONNECTED
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close()


def popped_messages(reply: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A pop reply's messages, each with its ``receipt_handle`` and ``attempt``."""
    messages: list[dict[str, Any]] = reply["messages"]
    for message, handle, attempt in zip(messages, reply["receipt_handles"], reply["attempts"], strict=True):
        message["receipt_handle"] = handle
        message["attempt"] = attempt
    return messages


class StoreClient:
    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, *, timeout_ms: int = 10_000,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None, curve: CurveKeys | None = None,
                 on_master: Callable[[str], None] | None = None, watch_connection: bool = False,
                 unreachable_ms: int | None = None, direct_replies: bool = True) -> None:
        """``curve``: the engine's public key and this client's key pair, for an engine with
        ``curve_enabled``. A key the engine does not allow gets no reply at all: a timeout.
        ``on_master``: follow a replica's ``NOT_MASTER`` to the master it names (the request goes
        again there, and so do the next ones); called with the master's endpoint when it does.
        Without it, ``NOT_MASTER`` is raised as any refusal.
        ``watch_connection``: a request whose connection breaks before its reply (the engine died, or
        answered no heartbeat for ``HEARTBEAT_TIMEOUT_MS``: paused or cut off) raises ``ConnectionLost``
        at once instead of waiting out its deadline, and one sent while the connection is refused
        (nothing listens) raises ``EngineUnreachable``: a broker set's client moves on to another
        engine (one more socket per client, and a poll of two).
        ``unreachable_ms``: without ``watch_connection``, a request raises ``EngineUnreachable`` once
        the connection has been refused for this long (an engine's front restarting is waited for
        that long; None: for the whole deadline, as ZeroMQ queues requests for a peer to come).
        ``direct_replies``: let the actors that make the answers send them straight here (see above)."""
        self.endpoint = endpoint
        self.on_master = on_master
        self.timeout_ms = timeout_ms
        self.curve = curve
        self.frame_bytes_max = FRAME_BYTES_MAX
        """The largest request sent (the engine's ``client_frame_bytes_max``; raise it with the engine's)."""
        self._context = context or zmq.Context.instance()
        self._ids = itertools.count(1)
        self.watch_connection = watch_connection
        self.unreachable_ms = 0 if watch_connection else unreachable_ms
        self.direct_replies = direct_replies
        self._monitor: zmq.Socket[bytes] | None = None
        self._refused_since: float | None = None  # monotonic time of the first refusal since a connection
        self._direct: list[str] = []  # the endpoints this socket connected to for direct answers
        self._send_peer: bytes | None = None  # the connection to the writer's port, which takes sends
        # ... and whether it is up: a connection ZeroMQ makes again keeps taking what is sent on it,
        # for a writer that may never come back (left down by the supervisor): its monitor says
        self._send_up = False
        self._straight: dict[int, bytes] = {}  # sends made straight to the writer, unanswered: id -> frame
        self._send_endpoint = ""
        self._route_asked = False
        self._socket = self._connect()

    def _connect(self) -> zmq.Socket[bytes]:
        sock = self._context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, _RECONNECT_IVL_MS)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full queue to the front blocks, as a DEALER's does
        # ZeroMQ's own routing ids begin with a 0 byte: one that does not tells the front it may be answered directly
        sock.setsockopt(zmq.ROUTING_ID, b"c" + os.urandom(15))
        if self.curve is not None:
            self.curve.apply(sock)
        if self.watch_connection:
            sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
            sock.setsockopt(zmq.HANDSHAKE_IVL, HEARTBEAT_TIMEOUT_MS)
        if self.watch_connection or self.unreachable_ms is not None:
            self._monitor = sock.get_monitor_socket(
                zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        elif self.direct_replies:  # for the writer's connection: a few events a connection, read at each send
            # (never the retries of a connection refused: every 10 ms they would fill the monitor's queue
            # of a client that sends nothing for a while, and ZeroMQ's I/O thread would wait on it)
            self._monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self._refused_since = None
        sock.setsockopt(zmq.CONNECT_ROUTING_ID, _FRONT)  # the connection's queue exists from now: sends wait in it
        allow_ipv6(sock, self.endpoint).connect(self.endpoint)
        self._direct = []
        self._send_peer = None
        self._send_endpoint = ""
        self._send_up = False
        self._straight = {}
        self._route_asked = not self.direct_replies
        return sock

    def _connect_direct(self, route: Mapping[str, Any]) -> None:
        """Connect to the actors that answer directly, as the ``route`` answer names them."""
        endpoints = route.get("reply_endpoints") if route.get("ok") else None
        for endpoint in endpoints if isinstance(endpoints, list) else ():
            if isinstance(endpoint, str) and "://" in endpoint and endpoint not in self._direct:
                self._socket.setsockopt(zmq.CONNECT_ROUTING_ID, b"d%d" % len(self._direct))
                try:
                    allow_ipv6(self._socket, endpoint).connect(endpoint)
                except zmq.ZMQError:  # an endpoint this host cannot reach: its answers come through the front
                    continue
                self._direct.append(endpoint)
        send_endpoint = route.get("send_endpoint") if route.get("ok") else None
        if isinstance(send_endpoint, str) and send_endpoint in self._direct:
            self._send_peer = b"d%d" % self._direct.index(send_endpoint)
            self._send_endpoint = send_endpoint

    def _send_frame(self, frame: bytes) -> None:
        """``frame`` to the front; beside the first request, the ``route`` that names the direct endpoints."""
        if not self._route_asked:
            self._route_asked = True
            self._socket.send_multipart([_FRONT, encode_request("route", _ROUTE_REQUEST_ID, {})])
        self._socket.send_multipart([_FRONT, frame])

    def _submit(self, op: str, request_id: int, frame: bytes) -> None:
        """``frame`` to the writer's port if it is a send and that connection is up (its monitor's
        news, read here; ZeroMQ's ROUTER_MANDATORY refuses it at once if the connection is not
        there, as a full queue does), else to the front."""
        if op == "send" and self._send_peer is not None:
            self._disconnected()  # the news of the writer's connection (``_send_up``)
            if self._send_up:
                try:
                    self._socket.send_multipart([self._send_peer, frame], zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
                else:
                    self._straight[request_id] = frame
                    return
        self._send_frame(frame)

    def _take(self, flags: int = 0) -> dict[str, Any] | None:
        """The next reply on the socket, from the front or an actor; None for the ``route`` asked for
        direct answers (taken here), and for a send the writer passed back (ROUTE_VIA_FRONT: sent
        again to the front here). ``zmq.Again`` with NOBLOCK when none is there."""
        reply: dict[str, Any] = _decoder.decode(self._socket.recv_multipart(flags)[-1])  # a msgpack map
        if not isinstance(reply, dict):
            return reply
        request_id = reply.get("id")
        if request_id == _ROUTE_REQUEST_ID:
            self._connect_direct(reply)
            return None
        if self._straight and isinstance(request_id, int) and request_id in self._straight:
            frame = self._straight.pop(request_id)
            if not reply.get("ok") and (reply.get("error") or {}).get("code") == ErrorCode.ROUTE_VIA_FRONT:
                self._send_frame(frame)  # nothing was stored: the front routes it
                return None
        return reply

    def _reconnect(self) -> None:
        """A fresh socket: a late reply on the old one cannot be taken for the next request's."""
        self._close_socket()
        self._socket = self._connect()

    def _close_socket(self) -> None:
        if self._monitor is not None:
            self._socket.disable_monitor()
            self._monitor.close()
            self._monitor = None
        self._socket.close()

    def _disconnected(self) -> bool:
        """Whether the monitor told of a broken connection to the front since it was last asked; it
        also keeps when the front's connection was first refused (``_refused_since``)."""
        broken = False
        while self._monitor is not None and self._monitor.poll(0):
            event = zmq.utils.monitor.recv_monitor_message(self._monitor)
            endpoint = event["endpoint"].decode()
            if endpoint in self._direct:  # a direct connection's break loses nothing
                if endpoint == self._send_endpoint and event["event"] != zmq.EVENT_CONNECT_RETRIED:
                    self._send_up = event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
                continue
            if event["event"] == zmq.EVENT_DISCONNECTED:
                broken = True
            elif event["event"] == zmq.EVENT_CONNECT_RETRIED:
                self._refused_since = self._refused_since or time.monotonic()
            elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._refused_since = None
        return broken

    def _unreachable(self) -> bool:
        """Whether the front's connection has been refused for ``unreachable_ms``."""
        return (self.unreachable_ms is not None and self._refused_since is not None
                and (time.monotonic() - self._refused_since) * 1000 >= self.unreachable_ms)

    def _await_reply(self, op: str, remaining_ms: int) -> bool:
        """Whether a reply frame came within ``remaining_ms`` (False also after a monitor event that was
        not a break: the caller looks again); ``ConnectionLost`` if the connection broke first,
        ``EngineUnreachable`` if it has been refused for ``unreachable_ms``."""
        if self._monitor is None or not (self.watch_connection or self.unreachable_ms is not None):
            return bool(self._socket.poll(remaining_ms))
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        ready = dict(poller.poll(remaining_ms))
        if self._socket in ready:
            return True
        if self._monitor in ready:
            broken = self._disconnected()
            if broken and self.watch_connection:
                self._reconnect()
                raise ConnectionLost(f"the connection to {self.endpoint} broke before the reply to {op!r}")
            if self._unreachable():
                self._reconnect()
                raise EngineUnreachable(self.endpoint)
        return False

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._close_socket()

    # -- transport ---------------------------------------------------------

    def send_raw(self, frame: bytes) -> None:
        """Send a frame as it is (for tests of bad input)."""
        self._socket.send_multipart([_FRONT, frame])

    def receive_raw(self, *, timeout_ms: int | None = None) -> dict[str, Any]:
        timeout = self.timeout_ms if timeout_ms is None else timeout_ms
        deadline = time.monotonic() + timeout / 1000
        while self._socket.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            reply = self._take()
            if reply is not None:
                return reply
        raise RequestTimeout(f"no reply from {self.endpoint} within {timeout} ms")

    def request(self, op: str, *, timeout_ms: int | None = None, _followed: bool = False,
                **fields: Any) -> dict[str, Any]:
        """Send one request and wait for its reply; raise EngineError if the engine refused it."""
        request_id = next(self._ids)
        self._disconnected()  # what an earlier connection went through does not concern this request
        self._submit(op, request_id, encode_request(op, request_id, fields, frame_bytes_max=self.frame_bytes_max))
        deadline = time.monotonic() + (self.timeout_ms if timeout_ms is None else timeout_ms) / 1000
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                # The socket may still deliver the late reply; start afresh so it cannot be mistaken.
                self._reconnect()
                raise RequestTimeout(f"no reply to {op!r} from {self.endpoint} within the deadline")
            if not self._await_reply(op, remaining_ms):
                continue
            reply = self._take()
            if reply is not None and reply.get("id") == request_id:
                break
        if not reply.get("ok"):
            error = reply.get("error") or {}
            details = {k: v for k, v in reply.items() if k not in ("v", "id", "ok", "error")}
            master = details.get("master_endpoint")
            if self.on_master is not None and not _followed and error.get("code") == ErrorCode.NOT_MASTER \
                    and isinstance(master, str) and master and master != self.endpoint:  # nothing was done there
                self._close_socket()
                self.endpoint = master
                self._socket = self._connect()
                self.on_master(master)
                return self.request(op, timeout_ms=timeout_ms, _followed=True, **fields)
            raise EngineError(error.get("code", 0), error.get("name", "UNKNOWN"), error.get("message", ""), details)
        return reply

    # -- operations --------------------------------------------------------

    def send(self, topic: str, messages: Iterable[Mapping[str, Any]], *, queue_id: int | None = None,
             sharding_key: str | None = None, wait_store: bool = True, delay_ms: int | None = None,
             deliver_at_ms: int | None = None, delay_level: int | None = None,
             transaction: bool = False, producer_group: str | None = None) -> list[dict[str, Any]]:
        """Store a batch in one queue; returns one result per message (status, msg_id, offsets).

        The queue is ``queue_id``, else the one ``sharding_key`` hashes to (per-key order),
        else the next one round robin.

        Delayed: ``delay_ms`` from now, ``deliver_at_ms`` (epoch ms) or a RocketMQ
        ``delay_level``: the batch is stored now and reaches its queue at that time.
        Transactional (``transaction`` with ``producer_group``): stored as half messages,
        invisible until ``end_transaction`` commits them; the results' ``msg_id`` names them.
        """
        fields: dict[str, Any] = {"topic": topic, "messages": list(messages), "wait_store": wait_store}
        optional = {"queue_id": queue_id, "sharding_key": sharding_key, "delay_ms": delay_ms,
                    "deliver_at_ms": deliver_at_ms, "delay_level": delay_level, "producer_group": producer_group}
        fields.update({name: value for name, value in optional.items() if value is not None})
        if transaction:
            fields["transaction"] = True
        results: list[dict[str, Any]] = self.request("send", **fields)["results"]
        return results

    def send_one(self, topic: str, body: bytes, *, tags: str | None = None, keys: Iterable[str] = (),
                 properties: Mapping[str, str] | None = None, queue_id: int | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"body": body, "keys": list(keys), "properties": dict(properties or {})}
        if tags is not None:
            message["tags"] = tags
        return self.send(topic, [message], queue_id=queue_id)[0]

    def pull(self, topic: str, queue_id: int, offset: int, *, max_messages: int = 32,
             max_bytes: int = 4 * 1024 * 1024, max_wait_ms: int = 0, subscription: str = "*") -> dict[str, Any]:
        """One pull: status, next_offset, min_offset, max_offset, messages.

        With ``max_wait_ms`` the engine holds a pull that finds nothing new until a
        message arrives or the time is up (long polling); the deadline grows to match.
        """
        fields: dict[str, Any] = {"topic": topic, "queue_id": queue_id, "offset": offset,
                                  "max_messages": max_messages, "max_bytes": max_bytes, "subscription": subscription}
        timeout_ms = None
        if max_wait_ms:
            fields["max_wait_ms"] = max_wait_ms
            timeout_ms = self.timeout_ms + max_wait_ms
        return self.request("pull", timeout_ms=timeout_ms, **fields)

    def query_by_key(self, topic: str, key: str, *, begin_timestamp: int = 0,
                     end_timestamp: int = 0x7FFFFFFFFFFFFFFF, max_results: int = 64) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.request(
            "query_by_key", topic=topic, key=key, begin_timestamp=begin_timestamp, end_timestamp=end_timestamp,
            max_results=max_results)["messages"]
        return messages

    def query_by_keys(self, topic: str, keys: Sequence[str], *, begin_timestamp: int = 0,
                      end_timestamp: int = 0x7FFFFFFFFFFFFFFF, max_results: int = 64,
                      keys_per_request: int = 1_000) -> list[list[dict[str, Any]]]:
        """``query_by_key`` for every key of ``keys``, many keys a round trip: each key's messages, in
        the keys' order. A reply that answers only the first keys (its size cap) is followed by a
        request for the rest."""
        found: list[list[dict[str, Any]]] = []
        while len(found) < len(keys):
            batch = list(keys[len(found):len(found) + keys_per_request])
            answered = self.request("query_by_keys", topic=topic, keys=batch, begin_timestamp=begin_timestamp,
                                    end_timestamp=end_timestamp, max_results=max_results)["found"]
            if not answered:
                raise ClientError("the engine answered no key of a query_by_keys")
            found += answered
        return found

    def get_by_id(self, msg_id: str) -> dict[str, Any]:
        message: dict[str, Any] = self.request("get_by_id", msg_id=msg_id)["message"]
        return message

    def create_topic(self, topic: str, *, queue_count: int | None = None) -> dict[str, Any]:
        fields: dict[str, Any] = {"topic": topic}
        if queue_count is not None:
            fields["queue_count"] = queue_count
        return self.request("create_topic", **fields)

    def delete_topic(self, topic: str) -> dict[str, Any]:
        """Delete a topic: its queues and every group's offsets go; the log keeps the bytes until
        retention. Returns ``topic`` and ``deletion_offset``."""
        return self.request("delete_topic", topic=topic)

    def list_topics(self) -> list[dict[str, Any]]:
        topics: list[dict[str, Any]] = self.request("list_topics")["topics"]
        return topics

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record that ``group`` will next consume ``offset`` of this queue."""
        self.request("commit_offset", group=group, topic=topic, queue_id=queue_id, offset=offset)

    def fetch_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The offset ``group`` committed for this queue, or -1 if none."""
        offset: int = self.request("fetch_offset", group=group, topic=topic, queue_id=queue_id)["offset"]
        return offset

    def queue_stats(self, topic: str, queue_id: int) -> dict[str, Any]:
        """min_offset, max_offset, message_count, earliest/latest_store_timestamp (-1 if empty)."""
        return self.request("queue_stats", topic=topic, queue_id=queue_id)

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int, *, boundary: str = "lower") -> int:
        """The queue offset of the first message stored at or after (``lower``) or the last at or
        before (``upper``) ``timestamp_ms``."""
        offset: int = self.request("offset_for_time", topic=topic, queue_id=queue_id, timestamp=timestamp_ms,
                                   boundary=boundary)["offset"]
        return offset

    def get_by_offset(self, commit_log_offset: int) -> dict[str, Any]:
        message: dict[str, Any] = self.request("get_by_offset", commit_log_offset=commit_log_offset)["message"]
        return message

    def consumer_lag(self, group: str, topic: str) -> dict[int, int]:
        """Messages not yet consumed by ``group`` per queue (max offset - committed offset)."""
        queues = {t["topic"]: t["queue_count"] for t in self.list_topics()}[topic]
        lag = {}
        for queue_id in range(queues):
            committed = self.fetch_offset(group, topic, queue_id)
            stats = self.queue_stats(topic, queue_id)
            lag[queue_id] = stats["max_offset"] - max(committed, stats["min_offset"])
        return lag

    # -- pop consumers (docs/protocol.md 4.x): per-message acknowledgement ----------------------

    def pop(self, group: str, topic: str, *, queue_id: int | None = None, max_messages: int = 32,
            invisible_ms: int = 30_000, max_wait_ms: int = 0, subscription: str = "*") -> list[dict[str, Any]]:
        """Take up to ``max_messages`` for ``group``; each stays invisible to the group's other pops
        for ``invisible_ms``, then comes back (attempt + 1) unless acked. Each message carries its
        ``receipt_handle`` and ``attempt``. Without ``queue_id`` the engine picks the queues."""
        fields: dict[str, Any] = {"group": group, "topic": topic, "max_messages": max_messages,
                                  "invisible_ms": invisible_ms, "subscription": subscription}
        if queue_id is not None:
            fields["queue_id"] = queue_id
        timeout_ms = None
        if max_wait_ms:
            fields["max_wait_ms"] = max_wait_ms
            timeout_ms = self.timeout_ms + max_wait_ms
        return popped_messages(self.request("pop", timeout_ms=timeout_ms, **fields))

    def ack(self, group: str, messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Acknowledge popped messages (their ``receipt_handle``); one request per queue.
        Returns the handles refused (stale: delivered again or changed since), with their error."""
        by_queue: dict[tuple[str, int], list[str]] = {}
        for message in messages:
            by_queue.setdefault((message["topic"], message["queue_id"]), []).append(message["receipt_handle"])
        failed: list[dict[str, Any]] = []
        for (topic, queue_id), handles in by_queue.items():
            for start in range(0, len(handles), 1024):
                reply = self.request("ack", group=group, topic=topic, queue_id=queue_id,
                                     receipt_handles=handles[start:start + 1024])
                failed.extend(reply["failed"])
        return failed

    def dead_letter(self, group: str, messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Give up on popped messages: each goes to ``%DLQ%{group}`` now, whatever its attempt.
        Returns the handles refused (stale), as ``ack`` does."""
        failed: list[dict[str, Any]] = []
        for message in messages:
            reply = self.request("ack", group=group, topic=message["topic"], queue_id=message["queue_id"],
                                 receipt_handles=[message["receipt_handle"]], dead_letter=True)
            failed.extend(reply["failed"])
        return failed

    def change_invisible_duration(self, group: str, message: Mapping[str, Any], invisible_ms: int) -> str:
        """Make a popped message invisible for ``invisible_ms`` from now; returns its new receipt
        handle (the old one is stale). 0 makes it visible again at once: a nack."""
        handle: str = self.request("change_invisible", group=group, topic=message["topic"],
                                   queue_id=message["queue_id"], receipt_handle=message["receipt_handle"],
                                   invisible_ms=invisible_ms)["receipt_handle"]
        return handle

    def nack(self, group: str, message: Mapping[str, Any]) -> str:
        """Give a popped message back now: it is redelivered with attempt + 1."""
        return self.change_invisible_duration(group, message, 0)

    def pop_stats(self, group: str, topic: str, queue_id: int) -> dict[str, Any]:
        """ack_floor, pop_cursor, in_flight, due, redelivered, dead_lettered, journal_entries, segments."""
        return self.request("pop_stats", group=group, topic=topic, queue_id=queue_id)

    # -- transactions (docs/protocol.md 4.13) ---------------------------------------------------

    def end_transaction(self, msg_id: str, decision: str, *, producer_group: str | None = None) -> str:
        """Commit (the half message reaches its topic) or roll back (it never does) the half message
        ``msg_id``, the id its send returned. Returns the decision that stands."""
        fields: dict[str, Any] = {"msg_id": msg_id, "decision": decision}
        if producer_group is not None:
            fields["producer_group"] = producer_group
        standing: str = self.request("end_transaction", **fields)["decision"]
        return standing

    def commit(self, msg_id: str) -> str:
        return self.end_transaction(msg_id, "commit")

    def rollback(self, msg_id: str) -> str:
        return self.end_transaction(msg_id, "rollback")

    def transaction_checks(self, producer_group: str, *, max_messages: int = 32,
                           max_wait_ms: int = 0) -> list[dict[str, Any]]:
        """The half messages of ``producer_group`` still undecided past ``transaction_timeout_ms``:
        answer each with ``end_transaction`` (its ``msg_id``), or it is asked again, then rolled
        back. Each carries its real ``topic``/``queue_id`` and ``check_times``."""
        timeout_ms = self.timeout_ms + max_wait_ms if max_wait_ms else None
        checks: list[dict[str, Any]] = self.request(
            "transaction_checks", timeout_ms=timeout_ms, producer_group=producer_group, max_messages=max_messages,
            max_wait_ms=max_wait_ms)["checks"]
        return checks

    def ping(self) -> bool:
        return bool(self.request("ping").get("pong"))

    def route(self) -> dict[str, Any]:
        """This engine's place in its broker set: role, epoch, and the master's endpoint (protocol 4.14)."""
        return self.request("route")

    def status(self) -> dict[str, Any]:
        return self.request("status")
