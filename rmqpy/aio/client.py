"""``AsyncClient``: the protocol of docs/protocol.md on one ``zmq.asyncio`` DEALER, many requests in flight.

    async with AsyncClient("tcp://127.0.0.1:10911") as client:
        results = await asyncio.gather(*(client.send("orders", [{"body": b"%d" % i}]) for i in range(100)))

Its operations mirror ``engine.client.StoreClient``'s and return the same plain maps;
``AsyncProducer`` and the async consumers build the typed API on top of it.

How requests share the socket. Each request gets an id (docs/protocol.md 1.4) and a
future in ``_pending``; one reader task receives every reply and resolves the future
with that id. The engine answers different operations from different processes, so
replies come back in any order; matching by id is what makes that safe. A reply whose
id nobody waits for (its request timed out) is dropped. Unlike ``StoreClient`` the
socket is not replaced after a timeout: that would lose the replies of every other
request in flight, and ids already keep a late reply from being mistaken for another.

``in_flight_max`` bounds the requests sent and not yet answered (the protocol asks for
a bound, 8.4); a request waits for a free slot, and its deadline runs while it waits.

Not thread-safe: use a client from the event loop that first used it. Any number of
tasks of that loop may call it at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from engine.client import (
    DEFAULT_ENDPOINT,
    FRAME_BYTES_MAX,
    HEARTBEAT_IVL_MS,
    HEARTBEAT_TIMEOUT_MS,
    ConnectionLost,
    EngineUnreachable,
    RequestTimeout,
    encode_request,
    popped_messages,
)
from engine.ipc.curve import CurveKeys
from rmqpy.errors import ClientClosed, engine_error

__all__ = ["AsyncClient"]

log = logging.getLogger(__name__)

_decoder = msgspec.msgpack.Decoder()

ACK_HANDLES_MAX = 1024  # receipt handles one ack request may carry (protocol 4.12)


class AsyncClient:
    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, *, timeout_ms: int = 10_000, in_flight_max: int = 256,
                 context: zmq.asyncio.Context | None = None, curve: CurveKeys | None = None,
                 watch_connection: bool = False, unreachable_ms: int | None = None) -> None:
        """``timeout_ms``: each call's deadline (long polls get their wait on top).
        ``curve``: the engine's public key and this client's key pair, for an engine with CURVE.
        ``watch_connection``: calls waiting when the connection breaks (or answers no heartbeat) raise
        ``ConnectionLost`` at once, and those waiting while it is refused ``EngineUnreachable``
        (``StoreClient``'s, for a broker set's producer). ``unreachable_ms``: without it, calls waiting
        while the connection has been refused this long raise ``EngineUnreachable``."""
        if in_flight_max < 1:
            raise ValueError("in_flight_max must be >= 1")
        self.endpoint = endpoint
        self.timeout_ms = timeout_ms
        self.curve = curve
        self.frame_bytes_max = FRAME_BYTES_MAX
        """The largest request sent (the engine's ``client_frame_bytes_max``; raise it with the engine's)."""
        self._context = context or zmq.asyncio.Context.instance()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._slots = asyncio.Semaphore(in_flight_max)
        self._socket: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closed = False
        self._broken: ClientClosed | None = None  # why the reader stopped, if it stopped by itself
        self.watch_connection = watch_connection
        self.unreachable_ms = 0 if watch_connection else unreachable_ms
        self._watcher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the socket; calls still waiting raise ``ClientClosed``."""
        if self._closed:
            return
        self._closed = True
        for task in (self._reader, self._watcher):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        self._fail_pending(ClientClosed(f"the client of {self.endpoint} was closed"))
        if self._socket is not None:
            if self._watcher is not None:
                self._socket.disable_monitor()
            self._socket.close(linger=0)

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered (nor timed out)."""
        return len(self._pending)

    # -- transport ---------------------------------------------------------

    def _open(self) -> zmq.asyncio.Socket:
        """The socket, made on first use so that it belongs to the running loop, with its reader task."""
        if self._closed:
            raise ClientClosed(f"the client of {self.endpoint} is closed")
        if self._broken is not None:
            raise self._broken
        if self._socket is None:
            sock = self._context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            if self.curve is not None:
                self.curve.apply(sock)
            if self.watch_connection:
                sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
                sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
                sock.setsockopt(zmq.HANDSHAKE_IVL, HEARTBEAT_TIMEOUT_MS)
            watched = self.watch_connection or self.unreachable_ms is not None
            monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED
                                              | zmq.EVENT_HANDSHAKE_SUCCEEDED) if watched else None
            sock.connect(self.endpoint)
            self._socket = sock
            loop = asyncio.get_running_loop()
            self._reader = loop.create_task(self._read_replies(sock))
            self._reader.add_done_callback(self._reader_ended)
            if monitor is not None:
                self._watcher = loop.create_task(self._watch(monitor))
        return self._socket

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        """Each break of the connection fails the calls waiting on it (their replies went with it), and
        each refusal past ``unreachable_ms`` the calls waiting for a connection. A call failed so may
        still sit in the socket's queue, to be sent when a connection is made: its owner closes
        this client and opens another (``AsyncProducer`` does)."""
        refused_since: float | None = None
        try:
            while True:
                event = zmq.utils.monitor.parse_monitor_message(await monitor.recv_multipart())
                if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    refused_since = None
                elif event["event"] == zmq.EVENT_DISCONNECTED and self.watch_connection:
                    self._fail_pending(ConnectionLost(f"the connection to {self.endpoint} broke before the reply"))
                elif event["event"] == zmq.EVENT_CONNECT_RETRIED and self.unreachable_ms is not None:
                    now = asyncio.get_running_loop().time()
                    refused_since = refused_since if refused_since is not None else now
                    if (now - refused_since) * 1000 >= self.unreachable_ms and self._pending:
                        self._fail_pending(EngineUnreachable(self.endpoint))
        finally:
            monitor.close(linger=0)

    async def _read_replies(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            frame = await sock.recv()
            try:
                reply = _decoder.decode(frame)
            except msgspec.DecodeError:
                log.warning("dropped a reply from %s that is not msgpack", self.endpoint)
                continue
            request_id = reply.get("id") if isinstance(reply, dict) else None
            future = self._pending.get(request_id) if isinstance(request_id, int) else None
            if future is not None and not future.done():
                future.set_result(reply)
            elif request_id == 0 and not reply.get("ok"):
                log.error("the engine could not read a request of this client (a client bug): %s", reply.get("error"))

    def _reader_ended(self, task: asyncio.Task[None]) -> None:
        """A reader that stops for any reason but ``close()`` fails every waiting call at once."""
        if task.cancelled():
            return
        self._broken = ClientClosed(f"the reply reader of {self.endpoint} stopped: {task.exception()!r}")
        self._fail_pending(self._broken)

    def _fail_pending(self, error: Exception) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)

    async def request(self, op: str, *, timeout_ms: int | None = None, **fields: Any) -> dict[str, Any]:
        """Send one request and wait for its reply; raise ``EngineError`` if the engine refused it."""
        frame_id = next(self._ids)
        frame = encode_request(op, frame_id, fields, frame_bytes_max=self.frame_bytes_max)  # FrameTooLarge: unsent
        sock = self._open()
        timeout = self.timeout_ms if timeout_ms is None else timeout_ms
        try:
            async with asyncio.timeout(timeout / 1000), self._slots:
                request_id = frame_id
                future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
                self._pending[request_id] = future
                try:
                    await sock.send(frame)
                    reply = await future
                finally:
                    del self._pending[request_id]
        except ConnectionLost:
            raise
        except TimeoutError:
            raise RequestTimeout(f"no reply to {op!r} from {self.endpoint} within {timeout} ms") from None
        if not reply.get("ok"):
            raise engine_error(reply)
        return reply

    def _long_poll_timeout(self, max_wait_ms: int) -> int | None:
        return self.timeout_ms + max_wait_ms if max_wait_ms else None

    # -- operations (as StoreClient's) ------------------------------------

    async def send(self, topic: str, messages: Iterable[Mapping[str, Any]], *, queue_id: int | None = None,
                   sharding_key: str | None = None, wait_store: bool = True, delay_ms: int | None = None,
                   deliver_at_ms: int | None = None, delay_level: int | None = None) -> list[dict[str, Any]]:
        """Store a batch in one queue, all or nothing; one result per message (``StoreClient.send``)."""
        fields: dict[str, Any] = {"topic": topic, "messages": list(messages), "wait_store": wait_store}
        optional = {"queue_id": queue_id, "sharding_key": sharding_key, "delay_ms": delay_ms,
                    "deliver_at_ms": deliver_at_ms, "delay_level": delay_level}
        fields.update({name: value for name, value in optional.items() if value is not None})
        results: list[dict[str, Any]] = (await self.request("send", **fields))["results"]
        return results

    async def pull(self, topic: str, queue_id: int, offset: int, *, max_messages: int = 32,
                   max_bytes: int = 4 * 1024 * 1024, max_wait_ms: int = 0, subscription: str = "*") -> dict[str, Any]:
        """One pull: status, next_offset, min_offset, max_offset, messages (long polling with ``max_wait_ms``)."""
        fields: dict[str, Any] = {"topic": topic, "queue_id": queue_id, "offset": offset,
                                  "max_messages": max_messages, "max_bytes": max_bytes, "subscription": subscription}
        if max_wait_ms:
            fields["max_wait_ms"] = max_wait_ms
        return await self.request("pull", timeout_ms=self._long_poll_timeout(max_wait_ms), **fields)

    async def pop(self, group: str, topic: str, *, queue_id: int | None = None, max_messages: int = 32,
                  invisible_ms: int = 30_000, max_wait_ms: int = 0, subscription: str = "*") -> list[dict[str, Any]]:
        """Take messages for a pop group; each carries its ``receipt_handle`` and ``attempt``."""
        fields: dict[str, Any] = {"group": group, "topic": topic, "max_messages": max_messages,
                                  "invisible_ms": invisible_ms, "subscription": subscription}
        if queue_id is not None:
            fields["queue_id"] = queue_id
        if max_wait_ms:
            fields["max_wait_ms"] = max_wait_ms
        return popped_messages(await self.request("pop", timeout_ms=self._long_poll_timeout(max_wait_ms), **fields))

    async def ack(self, group: str, messages: Iterable[Mapping[str, Any]], *,
                  dead_letter: bool = False) -> list[dict[str, Any]]:
        """Acknowledge (or dead-letter) popped messages, one request per queue, in flight together.
        Returns the handles refused, each with its error."""
        by_queue: dict[tuple[str, int], list[str]] = {}
        for message in messages:
            by_queue.setdefault((message["topic"], message["queue_id"]), []).append(message["receipt_handle"])
        extra = {"dead_letter": True} if dead_letter else {}
        calls = [self.request("ack", group=group, topic=topic, queue_id=queue_id,
                              receipt_handles=handles[start:start + ACK_HANDLES_MAX], **extra)
                 for (topic, queue_id), handles in by_queue.items()
                 for start in range(0, len(handles), ACK_HANDLES_MAX)]
        replies = await asyncio.gather(*calls)
        return [failure for reply in replies for failure in reply["failed"]]

    async def change_invisible_duration(self, group: str, message: Mapping[str, Any], invisible_ms: int) -> str:
        """Hide a popped message for ``invisible_ms`` from now (0: a nack); returns its new receipt handle."""
        reply = await self.request("change_invisible", group=group, topic=message["topic"],
                                   queue_id=message["queue_id"], receipt_handle=message["receipt_handle"],
                                   invisible_ms=invisible_ms)
        handle: str = reply["receipt_handle"]
        return handle

    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        await self.request("commit_offset", group=group, topic=topic, queue_id=queue_id, offset=offset)

    async def fetch_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The offset ``group`` committed for this queue, or -1 if none."""
        offset: int = (await self.request("fetch_offset", group=group, topic=topic, queue_id=queue_id))["offset"]
        return offset

    async def queue_stats(self, topic: str, queue_id: int) -> dict[str, Any]:
        return await self.request("queue_stats", topic=topic, queue_id=queue_id)

    async def list_topics(self) -> list[dict[str, Any]]:
        topics: list[dict[str, Any]] = (await self.request("list_topics"))["topics"]
        return topics

    async def create_topic(self, topic: str, *, queue_count: int | None = None) -> dict[str, Any]:
        fields: dict[str, Any] = {"topic": topic}
        if queue_count is not None:
            fields["queue_count"] = queue_count
        return await self.request("create_topic", **fields)

    async def query_by_key(self, topic: str, key: str, *, max_results: int = 64) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = (await self.request("query_by_key", topic=topic, key=key,
                                                             max_results=max_results))["messages"]
        return messages

    async def get_by_id(self, msg_id: str) -> dict[str, Any]:
        message: dict[str, Any] = (await self.request("get_by_id", msg_id=msg_id))["message"]
        return message

    async def ping(self) -> bool:
        return bool((await self.request("ping")).get("pong"))
