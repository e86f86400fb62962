"""``Producer``: send typed messages, wait for the result or get a future; retries on BUSY.

    with Producer("tcp://127.0.0.1:10911") as producer:
        result = producer.send("orders", b"hello", keys=["order-1"], tags="paid")
        future = producer.send_async("orders", b"later", delay_ms=30_000)
        print(result.msg_id, future.result().uniq_key)

Thread-safety: a ``Producer`` may be shared by any number of threads.

A cluster of broker sets has its own class, ``ClusterProducer`` (below), made of a ``Producer``
per set; ``Producer(cluster=...)`` returns one.

* ``send`` and ``send_batch`` go through one ``StoreClient`` socket, one request at a
  time (a lock keeps threads off each other's replies). A thread that waits for a
  retry's pause does not hold the lock.
* ``send_async`` and ``send_batch_async`` hand the send to a background thread that
  owns a second socket and runs an ``AsyncProducer``: requests from all threads are in
  flight together there, so this is the fast path for many threads or many messages.
  The thread and its socket are made at the first async send.

Retries: a send refused with ``BUSY`` or ``SERVICE_NOT_AVAILABLE`` (nothing was stored)
is sent again after a growing pause (``RetryPolicy``); any other refusal is raised at
once as ``EngineError``, and a ``RequestTimeout`` is never retried (the messages may
have been stored). Each message carries a ``UNIQ_KEY`` the producer made, the same on
every attempt: ``SendResult.uniq_key`` names it, and a consumer can drop duplicates by it.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, TypeVar

import msgspec
import zmq
import zmq.asyncio

from engine.client import (
    DEFAULT_ENDPOINT,
    EngineError,
    EngineUnreachable,
    RequestTimeout,
    StoreClient,
    engine_answers,
)
from engine.errors import ErrorCode
from engine.ipc.curve import CurveKeys
from rmqpy._loop_thread import LoopThread
from rmqpy._send import (
    FOLLOW_PROBE_MS,
    SendOptions,
    UniqKeys,
    batch_fields,
    endpoints_after,
    mapped,
    master_named,
    one_message,
)
from rmqpy.aio.producer import AsyncProducer
from rmqpy.cluster import Cluster, opened
from rmqpy.errors import ClientClosed
from rmqpy.message import OutgoingMessage, SendResult, send_results_from_wire
from rmqpy.retry import OnRetry, RetryPolicy, call_with_retry

__all__ = ["ClusterProducer", "Producer"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class Producer:
    def __new__(cls, endpoint: str = DEFAULT_ENDPOINT, *, cluster: Cluster | str | None = None,
                **options: Any) -> Any:
        """Given ``cluster``, a ``ClusterProducer`` with these options, not a ``Producer``: the same
        sends, over every broker set. Typed ``Any`` because a type checker takes any instance
        creation for the class named; code that wants the cluster's type names ``ClusterProducer``."""
        if cluster is not None:
            return ClusterProducer(cluster, **options)
        return super().__new__(cls)

    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, *, timeout_ms: int = 10_000, retry: RetryPolicy | None = None,
                 on_retry: OnRetry | None = None, wait_store: bool = True, in_flight_max: int = 256,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None, curve: CurveKeys | None = None,
                 cluster: Cluster | str | None = None) -> None:
        """``endpoint``: an engine, or the engines of a broker set separated by commas (docs/replication.md,
        "Failover"): sends go to the master; a send that timed out or whose connection broke (raised
        as ``ConnectionLost``, a ``RequestTimeout``: it may have been stored), or that an engine
        refused naming no master that answers (an election is under way), moves the producer to the
        next engine of the list that accepts a connection.
        ``timeout_ms``: the deadline of each attempt; keep it above the engine's
        ``sync_flush_timeout_ms`` (5 s) under ``SYNC_FLUSH``.
        ``retry``: when to retry (default ``RetryPolicy()``: up to 5 retries, 20 ms to 2 s apart);
        ``RetryPolicy.never()`` raises every refusal. ``on_retry(error, retry, pause_ms)`` is told
        of each retry, from the thread that sends (the background thread for async sends).
        ``wait_store``: under ``SYNC_FLUSH``, answer once on disk (True) or once written (False).
        ``in_flight_max``: async sends in flight at once; more wait for a free slot.
        ``cluster``: a cluster of broker sets (``rmqpy.cluster.Cluster``, or its address: etcd's
        ``http://host:port`` or any engine of it) instead of ``endpoint``: each send goes to the next
        queue of the topic's whole route, or to the queue ``sharding_key`` hashes to, at that
        queue's set (docs/cluster.md); ``queue_id`` is then refused (a set's own queue). ``__new__``
        answers it with a ``ClusterProducer``: this class is one set's."""
        assert cluster is None, "Producer.__new__ made a ClusterProducer"
        self.endpoints = [part.strip() for part in endpoint.split(",") if part.strip()]
        self.endpoint = self.endpoints[0]
        self.timeout_ms = timeout_ms
        self.retry = retry or RetryPolicy()
        self.on_retry = on_retry
        self.wait_store = wait_store
        self._in_flight_max = in_flight_max
        self._context = context
        self._curve = curve
        self._uniq_keys = UniqKeys()
        self._client = self._connect(self.endpoint)
        self._client_lock = threading.Lock()
        self._async_lock = threading.Lock()  # guards the fields below
        self._loop_thread: LoopThread | None = None
        self._async_producer: AsyncProducer | None = None
        self._unfinished: set[concurrent.futures.Future[Any]] = set()
        self._closed = False

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout_s: float = 30.0) -> None:
        """Wait (up to ``timeout_s``) for the async sends under way, then close both sockets."""
        with self._async_lock:
            if self._closed:
                return
            self._closed = True
            unfinished = list(self._unfinished)
        concurrent.futures.wait(unfinished, timeout=timeout_s)
        if self._loop_thread is not None and self._async_producer is not None:
            self._loop_thread.stop(self._async_producer.close(), timeout_s=timeout_s)
        with self._client_lock:
            self._client.close()

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every async send made so far has its result (or ``timeout_s`` passes)."""
        with self._async_lock:
            unfinished = list(self._unfinished)
        concurrent.futures.wait(unfinished, timeout=timeout_s)

    # -- blocking sends ----------------------------------------------------

    def send(self, topic: str, body: bytes, *, keys: Iterable[str] = (), tags: str | None = None,
             properties: Mapping[str, str] | None = None, flag: int = 0, born_timestamp: int | None = None,
             queue_id: int | None = None, sharding_key: str | None = None, delay_ms: int | None = None,
             deliver_at_ms: int | None = None, delay_level: int | None = None) -> SendResult:
        """Store one message and return where it went.

        The queue is ``queue_id``, else the one ``sharding_key`` hashes to (messages with
        one key keep their order), else the engine's next one round robin. At most one of
        ``delay_ms`` (from now), ``deliver_at_ms`` (epoch ms) and ``delay_level``
        (RocketMQ's levels) delays the message: it is stored now and reaches its queue then.
        """
        message = one_message(body, keys=keys, tags=tags, properties=properties, flag=flag,
                              born_timestamp=born_timestamp)
        [result] = self._send_now(topic, [message], self._options(queue_id, sharding_key, delay_ms,
                                                                  deliver_at_ms, delay_level))
        return result

    def send_batch(self, topic: str, messages: Iterable[OutgoingMessage | bytes], *, queue_id: int | None = None,
                   sharding_key: str | None = None, delay_ms: int | None = None, deliver_at_ms: int | None = None,
                   delay_level: int | None = None) -> list[SendResult]:
        """Store messages in one queue with one request, all or nothing, at consecutive offsets.

        A batch of two or more messages may take at most 4 MiB as records (about 180 bytes
        plus body, topic and properties per message; protocol 8.1); split larger ones.
        """
        return self._send_now(topic, messages, self._options(queue_id, sharding_key, delay_ms, deliver_at_ms,
                                                             delay_level))

    def _options(self, queue_id: int | None, sharding_key: str | None, delay_ms: int | None,
                 deliver_at_ms: int | None, delay_level: int | None) -> SendOptions:
        return SendOptions(queue_id=queue_id, sharding_key=sharding_key, delay_ms=delay_ms,
                           deliver_at_ms=deliver_at_ms, delay_level=delay_level, wait_store=self.wait_store)

    def _send_now(self, topic: str, messages: Iterable[OutgoingMessage | bytes],
                  options: SendOptions) -> list[SendResult]:
        batch, uniq_keys = batch_fields(messages, self._uniq_keys, options)
        fields = {**options.fields(), **batch}

        def attempt() -> list[SendResult]:
            with self._client_lock:
                if self._closed:
                    raise ClientClosed("the producer is closed")
                try:
                    results = self._client.request("send", topic=topic, **fields)["results"]
                except EngineError as exc:  # a replica: it names its master, where this producer goes now
                    master = master_named(exc, self.endpoint)
                    if master is not None and not engine_answers(master, timeout_ms=FOLLOW_PROBE_MS,
                                                                 context=self._context):
                        master = None  # the master it names is gone: an election is under way
                    if master is None:
                        if exc.code == ErrorCode.NOT_MASTER:  # nobody named (an election): the next engine
                            self._move_to(self._next_endpoint())
                        raise
                    self._move_to(master)
                    results = self._client.request("send", topic=topic, **fields)["results"]
                except (RequestTimeout, EngineUnreachable):  # maybe a master gone: the next request elsewhere
                    self._move_to(self._next_endpoint())
                    raise
            return send_results_from_wire(topic, results, uniq_keys)

        return call_with_retry(self.retry, attempt, on_retry=self.on_retry)

    def _next_endpoint(self) -> str:
        """The engine of the broker set after the current one that accepts a connection (a master
        just killed does not; the current one if it is alone, or if none does)."""
        following = endpoints_after(self.endpoints, self.endpoint)
        if len(following) == 1:
            return following[0]
        return next((endpoint for endpoint in following if engine_answers(endpoint, timeout_ms=FOLLOW_PROBE_MS,
                                                                           context=self._context)), following[0])

    def _move_to(self, endpoint: str) -> None:
        if endpoint == self.endpoint:
            return
        self._client.close()
        self.endpoint = endpoint
        self._client = self._connect(endpoint)

    def _connect(self, endpoint: str) -> StoreClient:
        """A broker set's producer learns at once that its engine's connection broke (a master gone)."""
        return StoreClient(endpoint, timeout_ms=self.timeout_ms, context=self._context, curve=self._curve,
                           watch_connection=len(self.endpoints) > 1)

    # -- async sends -------------------------------------------------------

    def send_async(self, topic: str, body: bytes, *, keys: Iterable[str] = (), tags: str | None = None,
                   properties: Mapping[str, str] | None = None, flag: int = 0, born_timestamp: int | None = None,
                   queue_id: int | None = None, sharding_key: str | None = None, delay_ms: int | None = None,
                   deliver_at_ms: int | None = None, delay_level: int | None = None,
                   ) -> concurrent.futures.Future[SendResult]:
        """``send`` without waiting: the future holds the ``SendResult`` or the exception. Any thread."""
        message = one_message(body, keys=keys, tags=tags, properties=properties, flag=flag,
                              born_timestamp=born_timestamp)
        options = self._options(queue_id, sharding_key, delay_ms, deliver_at_ms, delay_level)

        async def send_one(producer: AsyncProducer) -> SendResult:
            [result] = await producer.send_with_options(topic, [message], options)
            return result

        return self._send_later(send_one)

    def send_batch_async(self, topic: str, messages: Iterable[OutgoingMessage | bytes], *,
                         queue_id: int | None = None, sharding_key: str | None = None, delay_ms: int | None = None,
                         deliver_at_ms: int | None = None, delay_level: int | None = None,
                         ) -> concurrent.futures.Future[list[SendResult]]:
        """``send_batch`` without waiting. Any thread."""
        batch = list(messages)  # the caller may change its list at once
        options = self._options(queue_id, sharding_key, delay_ms, deliver_at_ms, delay_level)

        async def send_all(producer: AsyncProducer) -> list[SendResult]:
            return await producer.send_with_options(topic, batch, options)

        return self._send_later(send_all)

    def _send_later(self, send: Callable[[AsyncProducer], Coroutine[Any, Any, T]]) -> concurrent.futures.Future[T]:
        """Run ``send`` on the background thread's producer; the future is tracked until done."""
        with self._async_lock:
            if self._closed:
                raise ClientClosed("the producer is closed")
            loop_thread, producer = self._started()
            future = loop_thread.submit(send(producer))
            self._unfinished.add(future)
        future.add_done_callback(self._finished)
        return future

    def _finished(self, future: concurrent.futures.Future[Any]) -> None:
        with self._async_lock:
            self._unfinished.discard(future)

    def _started(self) -> tuple[LoopThread, AsyncProducer]:
        """The background thread and its producer, started on first use (under ``_async_lock``)."""
        if self._loop_thread is None or self._async_producer is None:
            context = zmq.asyncio.Context.shadow(self._context) if self._context is not None else None
            at = self.endpoints.index(self.endpoint) if self.endpoint in self.endpoints else 0
            order = self.endpoints[at:] + self.endpoints[:at]  # the async sends start where this one is
            self._async_producer = AsyncProducer(",".join(order), timeout_ms=self.timeout_ms, retry=self.retry,
                                                 on_retry=self.on_retry, wait_store=self.wait_store,
                                                 in_flight_max=self._in_flight_max, context=context,
                                                 curve=self._curve)
            self._loop_thread = LoopThread(f"rmqpy-producer-{self.endpoint}")
        return self._loop_thread, self._async_producer


class ClusterProducer:
    """Sends to the queues of a topic's whole route (docs/cluster.md, "Clients"): in turn, or by
    ``sharding_key`` (the same key, the same queue of the same set), through a ``Producer`` per set
    on the set's address (master, then replicas), so that within a set sends follow a failover as
    ``Producer`` does. ``queue_id`` is refused (a set's own queue: send to that set's ``Producer``).
    Options are ``Producer``'s; thread-safe as ``Producer``."""

    def __init__(self, cluster: Cluster | str, **producer_options: Any) -> None:
        self.cluster, self._owns_cluster = opened(cluster)
        self.options = producer_options
        self._producers: dict[str, Producer] = {}  # broker name -> a Producer on its set's address
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> ClusterProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout_s: float = 30.0) -> None:
        """Each set's ``Producer.close`` (its async sends under way first), then the routes if opened here."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            producers = list(self._producers.values())
        for producer in producers:
            producer.close(timeout_s)
        if self._owns_cluster:
            self.cluster.close()

    def flush(self, timeout_s: float | None = None) -> None:
        with self._lock:
            producers = list(self._producers.values())
        for producer in producers:
            producer.flush(timeout_s)

    def send(self, topic: str, body: bytes, *, keys: Iterable[str] = (), tags: str | None = None,
             properties: Mapping[str, str] | None = None, flag: int = 0, born_timestamp: int | None = None,
             queue_id: int | None = None, sharding_key: str | None = None, delay_ms: int | None = None,
             deliver_at_ms: int | None = None, delay_level: int | None = None) -> SendResult:
        message = one_message(body, keys=keys, tags=tags, properties=properties, flag=flag,
                              born_timestamp=born_timestamp)
        [result] = self.send_batch(topic, [message], queue_id=queue_id, sharding_key=sharding_key, delay_ms=delay_ms,
                                   deliver_at_ms=deliver_at_ms, delay_level=delay_level)
        return result

    def send_batch(self, topic: str, messages: Iterable[OutgoingMessage | bytes], *, queue_id: int | None = None,
                   sharding_key: str | None = None, delay_ms: int | None = None, deliver_at_ms: int | None = None,
                   delay_level: int | None = None) -> list[SendResult]:
        """One batch, to one queue of the route; a set that refuses a connection is passed over
        for the next queue of another set (nothing was stored there)."""
        self._check(queue_id)
        batch = list(messages)
        tried: set[str] = set()
        for broker, set_queue in self.cluster.route(topic).send_order(sharding_key, next(self._turn)):
            if broker in tried:
                continue
            try:
                results = self._producer(topic, broker).send_batch(
                    topic, batch, queue_id=set_queue, delay_ms=delay_ms, deliver_at_ms=deliver_at_ms,
                    delay_level=delay_level)
            except (EngineError, EngineUnreachable) as exc:
                stored_nowhere = isinstance(exc, EngineUnreachable) or exc.code == ErrorCode.SERVICE_NOT_AVAILABLE
                if not stored_nowhere or sharding_key is not None:
                    raise
                log.warning("broker set %r took no send (%s): the next queue of another set", broker, exc)
                tried.add(broker)
                self.cluster.route(topic, fresh=True)
                continue
            return _named(results, broker)
        raise EngineError(ErrorCode.SERVICE_NOT_AVAILABLE, ErrorCode.SERVICE_NOT_AVAILABLE.name,
                          f"no broker set of topic {topic!r} took the send (tried {sorted(tried)})")

    def send_async(self, topic: str, body: bytes, *, keys: Iterable[str] = (), tags: str | None = None,
                   properties: Mapping[str, str] | None = None, flag: int = 0, born_timestamp: int | None = None,
                   queue_id: int | None = None, sharding_key: str | None = None, delay_ms: int | None = None,
                   deliver_at_ms: int | None = None, delay_level: int | None = None,
                   ) -> concurrent.futures.Future[SendResult]:
        message = one_message(body, keys=keys, tags=tags, properties=properties, flag=flag,
                              born_timestamp=born_timestamp)
        sent = self.send_batch_async(topic, [message], queue_id=queue_id, sharding_key=sharding_key,
                                     delay_ms=delay_ms, deliver_at_ms=deliver_at_ms, delay_level=delay_level)
        return mapped(sent, lambda results: results[0])

    def send_batch_async(self, topic: str, messages: Iterable[OutgoingMessage | bytes], *,
                         queue_id: int | None = None, sharding_key: str | None = None, delay_ms: int | None = None,
                         deliver_at_ms: int | None = None, delay_level: int | None = None,
                         ) -> concurrent.futures.Future[list[SendResult]]:
        """``send_batch`` without waiting, to the next queue of the route (the set's ``Producer``
        retries there; a set out of reach is not passed over: the future holds the error)."""
        self._check(queue_id)
        batch = list(messages)
        broker, set_queue = self.cluster.route(topic).send_order(sharding_key, next(self._turn))[0]
        sent = self._producer(topic, broker).send_batch_async(
            topic, batch, queue_id=set_queue, delay_ms=delay_ms, deliver_at_ms=deliver_at_ms, delay_level=delay_level)
        return mapped(sent, lambda results: _named(results, broker))

    def _check(self, queue_id: int | None) -> None:
        if self._closed:
            raise ClientClosed("the producer is closed")
        if queue_id is not None:
            raise ValueError("a producer on a cluster picks the queue of the route: give sharding_key, or send "
                             "to one broker set's Producer for one of its queues")

    def _producer(self, topic: str, broker: str) -> Producer:
        with self._lock:  # threads sharing this producer share each set's Producer too
            if self._closed:
                raise ClientClosed("the producer is closed")
            producer = self._producers.get(broker)
            if producer is None:
                producer = self._producers[broker] = Producer(self.cluster.set_address(topic, broker),
                                                              **self.options)
            return producer


def _named(results: list[SendResult], broker: str) -> list[SendResult]:
    return [msgspec.structs.replace(r, broker_name=broker) for r in results]
