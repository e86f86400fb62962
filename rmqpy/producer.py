"""``Producer``: send typed messages, wait for the result or get a future; retries on BUSY.

    with Producer("tcp://127.0.0.1:10911") as producer:
        result = producer.send("orders", b"hello", keys=["order-1"], tags="paid")
        future = producer.send_async("orders", b"later", delay_ms=30_000)
        print(result.msg_id, future.result().uniq_key)

Thread-safety: a ``Producer`` may be shared by any number of threads.

A cluster of broker sets has its own class, ``ClusterProducer`` (below), made of a ``Producer``
per set; ``Producer(cluster=...)`` returns one.

* ``send`` and ``send_batch`` go through one ``SetClient`` socket, one request at a
  time (a lock keeps threads off each other's replies). A thread that waits for a
  retry's pause does not hold the lock.
* ``send_async`` and ``send_batch_async`` hand the send to a background thread that
  owns a second socket and runs an ``AsyncProducer``: requests from all threads are in
  flight together there, so this is the fast path for many threads or many messages.
  The thread and its socket are made at the first async send.

Retries: a send refused with ``BUSY``, ``SERVICE_NOT_AVAILABLE`` or ``SLAVE_NOT_AVAILABLE``
(nothing was stored) is sent again after a growing pause (``RetryPolicy``); on a broker set's
address, one whose master died, went silent or is being elected is sent to the next master
(``SetClient``). Any other refusal is raised at once as ``EngineError``, and a
``RequestTimeout`` is not retried (the master may have stored the messages). Each message
carries a ``UNIQ_KEY`` the producer made, the same on every attempt: ``SendResult.uniq_key``
names it, and a consumer can drop duplicates by it.
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

from engine.client import DEFAULT_ENDPOINT, ClientError, EngineError, EngineUnreachable
from engine.errors import ErrorCode
from engine.ipc.curve import CurveKeys
from rmqpy._failover import NoMaster, PassedOver
from rmqpy._loop_thread import LoopThread
from rmqpy._send import SendOptions, UniqKeys, batch_fields, mapped, one_message
from rmqpy._set_client import SetClient
from rmqpy.aio.producer import AsyncProducer
from rmqpy.cluster import Cluster, opened
from rmqpy.errors import ClientClosed
from rmqpy.message import OutgoingMessage, SendResult, send_results_from_wire
from rmqpy.retry import OnRetry, RetryPolicy

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
        r"""``endpoint``: an engine, or the engines of a broker set separated by commas (docs/replication.md,
        "Clients"): sends go to the master and follow it. A send whose engine died (its connection
        broke or is refused), went silent (no heartbeat for ``HEARTBEAT_TIMEOUT_MS``: paused, cut off)
        or refused it during an election (``NOT_MASTER``) is sent again, with the same ``UNIQ_KEY`` of each message,
        to the master the set's engines name, as soon as one does (``rmqpy/_failover.py``); the
        application sees an error only when no master serves before the deadline.
        ``timeout_ms``: the deadline of each send, retries and failover included; keep it above the
        engine's ``sync_flush_timeout_ms`` (5 s) under ``SYNC_FLUSH``.
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
        self.timeout_ms = timeout_ms
        self.retry = retry or RetryPolicy()
        self.on_retry = on_retry
        self.wait_store = wait_store
        self._in_flight_max = in_flight_max
        self._context = context
        self._curve = curve
        self._uniq_keys = UniqKeys()
        self._client = SetClient(endpoint, timeout_ms=timeout_ms, retry=self.retry, on_retry=on_retry,
                                 context=context, curve=curve)
        self.endpoints = self._client.endpoints
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
        self._client.close()

    @property
    def endpoint(self) -> str:
        """The engine the blocking sends go to now (the set's master, as last found)."""
        return self._client.endpoint

    @property
    def resends(self) -> int:
        """Blocking sends acknowledged after being sent again because their connection broke (a
        master that died or went silent with the send): each may be stored twice, both copies with
        the same ``UNIQ_KEY`` of each message."""
        return self._client.resends

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

    def _send_now(self, topic: str, messages: Iterable[OutgoingMessage | bytes], options: SendOptions, *,
                  wait_for_master: bool = True) -> list[SendResult]:
        """One send over the set's engines until its deadline (``SetClient``). Without
        ``wait_for_master``, ``NoMaster`` is raised after the first round of looking that found none
        (a cluster's producer then sends elsewhere)."""
        if self._closed:
            raise ClientClosed("the producer is closed")
        batch, uniq_keys = batch_fields(messages, self._uniq_keys, options)
        reply = self._client.request("send", wait_for_master=wait_for_master, topic=topic,
                                     **options.fields(), **batch)
        return send_results_from_wire(topic, reply["results"], uniq_keys, reply.get("epoch", 0))

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
        return self._send_batch_later(topic, list(messages),  # the caller may change its list at once
                                      self._options(queue_id, sharding_key, delay_ms, deliver_at_ms, delay_level))

    def _send_batch_later(self, topic: str, batch: list[OutgoingMessage | bytes], options: SendOptions, *,
                          wait_for_master: bool = True) -> concurrent.futures.Future[list[SendResult]]:
        async def send_all(producer: AsyncProducer) -> list[SendResult]:
            return await producer.send_with_options(topic, batch, options, wait_for_master=wait_for_master)

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
        self._passed_over = PassedOver(self._master_found, curve=producer_options.get("curve"))

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
        self._passed_over.close()
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
        """One batch, to one queue of the route. Without ``sharding_key``, a set that has no master
        (``NoMaster``: it did not wait for one) or refuses a connection is passed over for the next
        queue of another set, and later keyless sends pass it over until it has a master again; with
        it, the key's queue waits for its set's master as ``Producer`` does, and fails alone."""
        self._check(queue_id)
        batch = list(messages)
        tried: set[str] = set()
        for broker, set_queue in self._send_order(topic, sharding_key):
            if broker in tried:
                continue
            producer = self._producer(topic, broker)
            options = producer._options(set_queue, None, delay_ms, deliver_at_ms, delay_level)
            try:
                results = producer._send_now(topic, batch, options, wait_for_master=sharding_key is not None)
            except (EngineError, EngineUnreachable, NoMaster) as exc:
                if sharding_key is not None or not self._passes_over(topic, broker, producer, exc):
                    raise
                tried.add(broker)
                continue
            return _named(results, broker)
        raise EngineError(ErrorCode.SERVICE_NOT_AVAILABLE, ErrorCode.SERVICE_NOT_AVAILABLE.name,
                          f"no broker set of topic {topic!r} took the send (tried {sorted(tried)})")

    def _send_order(self, topic: str, sharding_key: str | None) -> list[tuple[str, int]]:
        """The queues to try, in turn: the route's order, the sets passed over last."""
        order = self.cluster.route(topic).send_order(sharding_key, next(self._turn))
        if sharding_key is not None:
            return order[:1]
        return sorted(order, key=lambda queue: queue[0] in self._passed_over)  # a stable sort

    def _passes_over(self, topic: str, broker: str, producer: Producer, error: ClientError) -> bool:
        """Whether a keyless send refused with ``error`` goes to another set (nothing was stored, or
        the set lost its master); a set without a master is passed over until it has one again."""
        if isinstance(error, NoMaster):
            self._passed_over.mark(broker, producer.endpoints, producer.endpoint)
        elif not (isinstance(error, EngineUnreachable) or
                  (isinstance(error, EngineError) and error.code == ErrorCode.SERVICE_NOT_AVAILABLE)):
            return False
        log.warning("broker set %r took no send (%s): the next queue of another set", broker, error)
        self.cluster.route(topic, fresh=True)
        return True

    def _master_found(self, broker: str, master: str) -> None:
        """A set passed over has a master again: its producer goes there before the next send."""
        with self._lock:
            producer = self._producers.get(broker)
        if producer is not None:
            producer._client.move_to(master)

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
        """``send_batch`` without waiting, to the next queue of the route, passing over the sets
        without a master as ``send_batch`` does (the future holds the last error if none took it)."""
        self._check(queue_id)
        batch = list(messages)
        order = self._send_order(topic, sharding_key)
        sent: concurrent.futures.Future[list[SendResult]] = concurrent.futures.Future()

        def attempt(tried: frozenset[str]) -> None:
            broker, set_queue = next(queue for queue in order if queue[0] not in tried)
            producer = self._producer(topic, broker)
            options = producer._options(set_queue, None, delay_ms, deliver_at_ms, delay_level)
            future = producer._send_batch_later(topic, batch, options, wait_for_master=sharding_key is not None)

            def done(finished: concurrent.futures.Future[list[SendResult]]) -> None:
                error = finished.exception()
                if error is None:
                    sent.set_result(_named(finished.result(), broker))
                    return
                passed = tried | {broker}
                try:
                    if (sharding_key is not None or not isinstance(error, ClientError)
                            or not any(queue[0] not in passed for queue in order)
                            or not self._passes_over(topic, broker, producer, error)):
                        sent.set_exception(error)
                        return
                    attempt(passed)
                except Exception as exc:  # ClientClosed, a route out of reach: the caller's future holds it
                    sent.set_exception(exc)

            future.add_done_callback(done)

        attempt(frozenset())
        return sent

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
