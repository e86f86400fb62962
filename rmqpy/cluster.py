"""Clients of a cluster of broker sets: topics spread over sets, found by their routes in etcd.

    cluster = Cluster("http://127.0.0.1:2379")             # the etcd the broker sets elect on
    cluster.create_topic("orders", queue_count=8)            # 4 queues on each of two sets
    with ClusterProducer(cluster) as producer:
        producer.send("orders", b"hello")                    # round robin over all 8 queues
    with ClusterPullConsumer(cluster, "billing", "orders") as consumer:
        for message in consumer:                             # from every set, shared in the group
            ...

A queue of the cluster is (broker name, queue id): each broker set serves its own queues
0..n-1 of the topic (RocketMQ's ``MessageQueue``). The routes are etcd's
(``engine/coordination/routes.py``), written by each set's master; a client reads a topic's
route once and again after ``route_ttl_ms`` or a failure. Within a set, sends follow its
master across a failover as ``Producer`` does on a set's address; a consumer reads each
set through a ``PullConsumer`` of its own, a member of the group there (the group's
members share each set's queues: ``rmqpy/_group_member.py``), opened again on the new
master after a failover. ``ClusterPopConsumer`` pops from each set in turn and acknowledges
each message at the set that stored it.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

import msgspec
import zmq

from engine.client import ClientError, EngineError, EngineUnreachable, RequestTimeout
from engine.coordination.etcd import EtcdUnavailable
from engine.coordination.routes import RouteReader, TopicRoute, broker_masters, create_spread_topic
from engine.errors import ErrorCode
from rmqpy._send import mapped
from rmqpy.message import Message, OutgoingMessage, SendResult
from rmqpy.pop_consumer import PopConsumer
from rmqpy.producer import Producer
from rmqpy.pull_consumer import PullConsumer

__all__ = ["Cluster", "ClusterPopConsumer", "ClusterProducer", "ClusterPullConsumer"]

log = logging.getLogger(__name__)
DEFAULT_CLUSTER = "DefaultCluster"
_ROUTE_CHECK_S = 2.0  # a consumer reads the route again this often (a set's new master, a new set)
_ROUTE_RETRY_S = 0.5  # ... or this often while a set of the route has no consumer


class Cluster:
    """The routes of a cluster, read from ``address``: etcd's client endpoints (``http://host:port``,
    comma-separated or a list), or any engine of the cluster (``tcp://host:port``: its ``route`` op
    answers from the cluster's routes it mirrors). Creating a spread topic needs etcd."""

    def __init__(self, address: str | Iterable[str], *, cluster_name: str = DEFAULT_CLUSTER, timeout_ms: int = 3_000,
                 route_ttl_ms: int = 30_000) -> None:
        self.reader = RouteReader(address, cluster_name=cluster_name, timeout_ms=timeout_ms)
        self.address = self.reader.address
        self.cluster_name = cluster_name
        self.timeout_ms = timeout_ms
        self.route_ttl_ms = route_ttl_ms
        self._routes: dict[str, tuple[float, TopicRoute]] = {}

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.reader.close()

    def route(self, topic: str, *, fresh: bool = False) -> TopicRoute:
        """The topic's route (``EngineError`` TOPIC_NOT_FOUND if no broker set serves it)."""
        cached = self._routes.get(topic)
        if fresh or cached is None or time.monotonic() - cached[0] > self.route_ttl_ms / 1000:
            try:
                cached = (time.monotonic(), self.reader.topic_route(topic))
            except (EtcdUnavailable, EngineUnreachable, RequestTimeout):
                if cached is None:
                    raise
                log.warning("%s out of reach: the route of %r kept as it was", self.address, topic)
            self._routes[topic] = cached
        if not cached[1].brokers:
            raise EngineError(ErrorCode.TOPIC_NOT_FOUND, ErrorCode.TOPIC_NOT_FOUND.name,
                              f"no broker set of cluster {self.cluster_name!r} serves topic {topic!r}")
        return cached[1]

    def masters(self) -> dict[str, str]:
        """Every broker set with a master now: broker name -> the endpoint it takes writes on."""
        return broker_masters(self.reader.require_etcd("listing the broker sets"), self.cluster_name)

    def create_topic(self, topic: str, queue_count: int, *, brokers: Iterable[str] | None = None,
                     wait_ms: int = 10_000) -> TopicRoute:
        """Spread ``queue_count`` queues over ``brokers`` (default: every set with a master), as evenly as
        can be, and wait until the route says so (``engine.coordination.routes.create_spread_topic``)."""
        route = create_spread_topic(self.reader.require_etcd("creating a spread topic"), self.cluster_name, topic,
                                    queue_count, brokers=brokers, timeout_ms=self.timeout_ms, wait_ms=wait_ms)
        self._routes[topic] = (time.monotonic(), route)
        return route

    def set_address(self, topic: str, broker_name: str) -> str:
        """A broker set's address for ``Producer``: its master first, then its replicas."""
        for broker in self.route(topic).brokers:
            if broker.broker_name == broker_name:
                return ",".join(e for e in (broker.master_endpoint, *broker.replica_endpoints) if e)
        raise EngineError(ErrorCode.TOPIC_NOT_FOUND, ErrorCode.TOPIC_NOT_FOUND.name,
                          f"broker set {broker_name!r} does not serve topic {topic!r}")


class ClusterProducer:
    """Sends to the queues of a topic's whole route: in turn, or by ``sharding_key`` (the same key,
    the same queue of the same set). Thread-safe as ``Producer``."""

    def __init__(self, cluster: Cluster | str, **producer_options: Any) -> None:
        self.cluster, self._owns_cluster = _opened(cluster)
        self.options = producer_options
        self._producers: dict[str, Producer] = {}  # broker name -> a Producer on its set's address
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def __enter__(self) -> ClusterProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for producer in self._producers.values():
            producer.close()
        self._producers.clear()
        if self._owns_cluster:
            self.cluster.close()

    def send(self, topic: str, body: bytes, *, sharding_key: str | None = None, **options: Any) -> SendResult:
        message = OutgoingMessage(body=body, **_message_fields(options))  # the rest of options are the batch's
        [result] = self.send_batch(topic, [message], sharding_key=sharding_key, **options)
        return result

    def send_batch(self, topic: str, messages: Iterable[OutgoingMessage | bytes], *, sharding_key: str | None = None,
                   **options: Any) -> list[SendResult]:
        """One batch, to one queue of the route; a set that refuses a connection is passed over
        for the next queue of another set (nothing was stored there)."""
        batch = list(messages)
        queues = self.cluster.route(topic).queues
        start = self._first(sharding_key)
        tried: set[str] = set()
        for step in range(len(queues)):
            broker, queue_id = queues[(start + step) % len(queues)]
            if broker in tried:
                continue
            try:
                results = self._producer(topic, broker).send_batch(topic, batch, queue_id=queue_id, **options)
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

    def send_batch_async(self, topic: str, messages: Iterable[OutgoingMessage | bytes], *,
                         sharding_key: str | None = None, **options: Any,
                         ) -> concurrent.futures.Future[list[SendResult]]:
        """``send_batch`` without waiting, to the next queue of the route (the set's ``Producer``
        retries there; a set out of reach is not passed over: the future holds the error)."""
        batch = list(messages)
        queues = self.cluster.route(topic).queues
        broker, queue_id = queues[self._first(sharding_key) % len(queues)]
        sent = self._producer(topic, broker).send_batch_async(topic, batch, queue_id=queue_id, **options)
        return mapped(sent, lambda results: _named(results, broker))

    def flush(self, timeout_s: float | None = None) -> None:
        for producer in list(self._producers.values()):
            producer.flush(timeout_s)

    def _first(self, sharding_key: str | None) -> int:
        return zlib.crc32(sharding_key.encode()) if sharding_key is not None else next(self._turn)

    def _producer(self, topic: str, broker: str) -> Producer:
        with self._lock:  # threads sharing this producer share each set's Producer too
            producer = self._producers.get(broker)
            if producer is None:
                producer = self._producers[broker] = Producer(self.cluster.set_address(topic, broker),
                                                              **self.options)
            return producer


def _opened(cluster: Cluster | str) -> tuple[Cluster, bool]:
    """The cluster, and whether it was opened here from its address (then its user closes it)."""
    return (Cluster(cluster), True) if isinstance(cluster, str) else (cluster, False)


def _named(results: list[SendResult], broker: str) -> list[SendResult]:
    return [msgspec.structs.replace(r, broker_name=broker) for r in results]


def _message_fields(options: dict[str, Any]) -> dict[str, Any]:
    """The per-message options of ``send`` taken out of ``options`` (the rest are the batch's)."""
    fields: dict[str, Any] = {name: options.pop(name) for name in ("keys", "tags", "properties", "flag")
                              if name in options}
    if "keys" in fields:
        fields["keys"] = tuple(fields["keys"])
    return fields


C = TypeVar("C", PullConsumer, PopConsumer)


class _SetReaders(Generic[C]):
    """A consumer per broker set serving a topic, on the set's master now. A set whose master moved
    gets a new one (``drop`` lets the old go); a set electing its master, or out of reach, gets none
    until the route is read again: every ``_ROUTE_CHECK_S``, or ``_ROUTE_RETRY_S`` while one is missing."""

    def __init__(self, cluster: Cluster, topic: str, open_reader: Callable[[str], C],
                 drop: Callable[[C], None]) -> None:
        self.cluster = cluster
        self.topic = topic
        self.open_reader: Callable[[str], C] = open_reader
        self.drop: Callable[[C], None] = drop
        self.readers: dict[str, tuple[str, C]] = {}  # broker name -> (master endpoint, its consumer)
        self.checked = 0.0  # when the route was last read
        self.incomplete = False  # a set of the route has no consumer

    def due(self) -> bool:
        since = time.monotonic() - self.checked
        return since > _ROUTE_CHECK_S or (self.incomplete and since > _ROUTE_RETRY_S)

    def follow(self, *, fresh: bool) -> None:
        route = self.cluster.route(self.topic, fresh=fresh)
        self.incomplete = False
        for broker in route.brokers:
            current = self.readers.get(broker.broker_name)
            if current is not None and current[0] == broker.master_endpoint:
                continue
            if current is not None:
                log.info("broker set %r now has its master at %s", broker.broker_name, broker.master_endpoint)
                self.drop(current[1])
                del self.readers[broker.broker_name]
            if not broker.master_endpoint:
                self.incomplete = True  # an election under way: looked at again soon
                continue
            try:
                reader = self.open_reader(broker.master_endpoint)
            except ClientError as exc:
                log.warning("broker set %r not readable now (%s): tried again", broker.broker_name, exc)
                self.incomplete = True
                continue
            self.readers[broker.broker_name] = (broker.master_endpoint, reader)
        self.checked = time.monotonic()

    def in_turn(self, turn: int) -> list[tuple[str, C]]:
        """(broker name, consumer) of every set, starting at the ``turn``-th (sets sorted by name)."""
        brokers = sorted(self.readers)
        if not brokers:
            return []
        first = turn % len(brokers)
        return [(b, self.readers[b][1]) for b in brokers[first:] + brokers[:first]]

    def consumers(self) -> list[C]:
        return [reader for _endpoint, reader in self.readers.values()]


class ClusterPullConsumer:
    """A member of ``group`` on every broker set serving ``topic``: messages from all of them.
    Options are ``PullConsumer``'s (``queue_ids`` excepted)."""

    def __init__(self, cluster: Cluster | str, group: str, topic: str, *, max_wait_ms: int = 5_000,
                 idle_timeout_ms: int | None = None, **consumer_options: Any) -> None:
        self.cluster, self._owns_cluster = _opened(cluster)
        self.group = group
        self.topic = topic
        self.max_wait_ms = max_wait_ms
        self.idle_timeout_ms = idle_timeout_ms
        self._sets = _SetReaders(self.cluster, topic, lambda endpoint: PullConsumer(
            group, topic, endpoint=endpoint, max_wait_ms=max_wait_ms, **consumer_options), _drop_pull)
        self._turn = 0
        self._closed = False
        try:
            self._sets.follow(fresh=False)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ClusterPullConsumer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(finish=exc_type is None)

    def close(self, *, finish: bool = True) -> None:
        self._closed = True
        for consumer in self._sets.consumers():
            consumer.close(finish=finish)
        self._sets.readers.clear()
        if self._owns_cluster:
            self.cluster.close()

    def queues(self) -> dict[str, list[int]]:
        """The queues this member reads now, per broker set."""
        return {broker: consumer.queue_ids for broker, (_e, consumer) in self._sets.readers.items()}

    def __iter__(self) -> Iterator[Message]:
        idle_since = time.monotonic()
        while not self._closed:
            messages = self.poll(self.max_wait_ms if self.idle_timeout_ms is None else
                                 max(0, int(self.idle_timeout_ms - (time.monotonic() - idle_since) * 1000)),
                                 max_messages=1)
            if messages:
                yield messages[0]
                idle_since = time.monotonic()
            elif self.idle_timeout_ms is not None and time.monotonic() - idle_since >= self.idle_timeout_ms / 1000:
                return

    def poll(self, timeout_ms: int | None = None, *, max_messages: int | None = None) -> list[Message]:
        """Messages of one broker set (each set in turn), waiting up to ``timeout_ms`` for the first."""
        deadline = time.monotonic() + (self.max_wait_ms if timeout_ms is None else timeout_ms) / 1000
        while True:
            if self._sets.due():
                self._sets.follow(fresh=True)
            for _broker, consumer in self._sets.in_turn(self._turn):
                self._turn += 1
                messages = consumer.poll(0, max_messages=max_messages)
                if messages:
                    return messages
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            poller = zmq.Poller()
            for consumer in self._sets.consumers():
                poller.register(consumer.socket, zmq.POLLIN)
            poller.poll(max(1, int(min(remaining, 0.1) * 1000)))

    def commit(self) -> None:
        for consumer in self._sets.consumers():
            consumer.commit()


def _drop_pull(consumer: PullConsumer) -> None:
    """A set's consumer whose master moved: closed without the commit the old master cannot take (at
    least once: its last messages are read again)."""
    consumer.auto_commit = False
    consumer.close(finish=False)


class ClusterPopConsumer:
    """A worker of pop group ``group`` on every broker set serving ``topic``: ``pop`` takes from the
    sets in turn, ``ack``/``nack`` go to the set that stored the message (by its ``store_host``).
    Options are ``PopConsumer``'s."""

    def __init__(self, cluster: Cluster | str, group: str, topic: str, *, max_wait_ms: int = 1_000,
                 **consumer_options: Any) -> None:
        self.cluster, self._owns_cluster = _opened(cluster)
        self.max_wait_ms = max_wait_ms
        self._sets = _SetReaders(self.cluster, topic, lambda endpoint: PopConsumer(
            group, topic, endpoint=endpoint, max_wait_ms=max_wait_ms, **consumer_options), PopConsumer.close)
        self._stored_by: dict[str, str] = {}  # a message's store_host -> the broker set that stored it
        self._turn = 0
        try:
            self._sets.follow(fresh=False)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ClusterPopConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for consumer in self._sets.consumers():
            consumer.close()
        self._sets.readers.clear()
        if self._owns_cluster:
            self.cluster.close()

    def pop(self, max_messages: int | None = None, *, timeout_ms: int | None = None,
            invisible_ms: int | None = None) -> list[Message]:
        """Up to ``max_messages`` from one set (each set in turn), waiting up to ``timeout_ms`` (default
        ``max_wait_ms``) for the first: each set's pop waits its share of it."""
        if self._sets.due():
            self._sets.follow(fresh=True)
        deadline = time.monotonic() + (self.max_wait_ms if timeout_ms is None else timeout_ms) / 1000
        while True:
            sets = self._sets.in_turn(self._turn)
            if not sets:
                return []
            broker, consumer = sets[0]
            self._turn += 1
            share_ms = max(0, int((deadline - time.monotonic()) * 1000 / len(sets)))
            try:
                popped = consumer.pop(max_messages, timeout_ms=share_ms, invisible_ms=invisible_ms)
            except ClientError as exc:
                log.warning("broker set %r: %s (its route is read again)", broker, exc)
                self._sets.follow(fresh=True)
                popped = []
            for message in popped:
                self._stored_by[message.store_host] = broker
            if popped or time.monotonic() >= deadline:
                return popped

    def _owner(self, message: Message) -> PopConsumer:
        broker = self._stored_by.get(message.store_host)
        if broker is None or broker not in self._sets.readers:
            raise EngineError(ErrorCode.INVALID_RECEIPT_HANDLE, ErrorCode.INVALID_RECEIPT_HANDLE.name,
                              f"message {message.msg_id} was not popped from a broker set this consumer reads")
        return self._sets.readers[broker][1]

    def ack(self, message: Message) -> None:
        self._owner(message).ack(message)

    def ack_all(self, messages: Iterable[Message]) -> list[tuple[Message, EngineError]]:
        """One ``ack_all`` per set that stored some of ``messages``; the refused ones, with why."""
        by_set: dict[int, tuple[PopConsumer, list[Message]]] = {}
        for message in messages:
            owner = self._owner(message)
            by_set.setdefault(id(owner), (owner, []))[1].append(message)
        return [refused for owner, mine in by_set.values() for refused in owner.ack_all(mine)]

    def nack(self, message: Message) -> None:
        self._owner(message).nack(message)

    def change_invisible_duration(self, message: Message, invisible_ms: int) -> Message:
        return self._owner(message).change_invisible_duration(message, invisible_ms)

    def dead_letter(self, message: Message) -> None:
        self._owner(message).dead_letter(message)
