"""A cluster of broker sets: topics spread over sets, found by their routes in etcd.

    cluster = Cluster("http://127.0.0.1:2379")             # the etcd the broker sets elect on
    cluster.create_topic("orders", queue_count=8)            # 4 queues on each of two sets
    with ClusterProducer(cluster) as producer:               # or Producer(cluster=cluster)
        producer.send("orders", b"hello")                    # round robin over all 8 queues
    with ClusterPullConsumer(cluster, "billing", "orders") as consumer:
        for message in consumer:                             # from every set, shared in the group
            ...

A queue of the cluster is (broker name, queue id): each broker set serves its own queues
0..n-1 of the topic (RocketMQ's ``MessageQueue``). The routes are etcd's
(``engine/coordination/routes.py``), written by each set's master; a client reads a topic's
route once and again after ``route_ttl_ms`` or a failure.

This module is the routes and what the cluster clients share (``SetReaders``); the clients
themselves are classes of their own beside the single set's, each made of that set's clients:
``ClusterProducer`` (``rmqpy/producer.py``) keeps a ``Producer`` per set, which follows its
set's master across a failover; ``ClusterPullConsumer`` (``rmqpy/pull_consumer.py``) reads each
set through a ``PullConsumer`` of its own, a member of the group there (the group's members
share each set's queues: ``rmqpy/_group_member.py``), opened again on the new master after a
failover; ``ClusterPopConsumer`` (``rmqpy/pop_consumer.py``) pops from each set in turn and
acknowledges each message at the set that stored it. Nothing here imports them: they import this.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from engine.client import ClientError, EngineError, EngineUnreachable, RequestTimeout
from engine.coordination.etcd import EtcdLogin, EtcdTls, EtcdUnavailable
from engine.coordination.routes import RouteReader, TopicRoute, broker_masters, create_spread_topic
from engine.errors import ErrorCode
from engine.ipc.curve import CurveKeys

__all__ = ["Cluster", "SetReaders", "opened"]

log = logging.getLogger(__name__)
DEFAULT_CLUSTER = "DefaultCluster"
_ROUTE_CHECK_S = 2.0  # a consumer reads the route again this often (a set's new master, a new set)
_ROUTE_RETRY_S = 0.5  # ... or this often while a set of the route has no consumer


class Cluster:
    """The routes of a cluster, read from ``address``: etcd's client endpoints (``http://host:port``,
    comma-separated or a list), or any engine of the cluster (``tcp://host:port``: its ``route`` op
    answers from the cluster's routes it mirrors). Creating a spread topic needs etcd."""

    def __init__(self, address: str | Iterable[str], *, cluster_name: str = DEFAULT_CLUSTER, timeout_ms: int = 3_000,
                 route_ttl_ms: int = 30_000, etcd_tls: EtcdTls | None = None, etcd_login: EtcdLogin | None = None,
                 curve: CurveKeys | None = None) -> None:
        """``etcd_tls``, ``etcd_login``: a secure cluster's etcd (https, its own users); ``curve``: the
        key an engine address is reached with (``Credentials.cluster`` gives all three)."""
        self.reader = RouteReader(address, cluster_name=cluster_name, timeout_ms=timeout_ms, tls=etcd_tls,
                                  login=etcd_login, curve=curve)
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


def opened(cluster: Cluster | str) -> tuple[Cluster, bool]:
    """The cluster, and whether it was opened here from its address (then its user closes it)."""
    return (Cluster(cluster), True) if isinstance(cluster, str) else (cluster, False)


C = TypeVar("C")  # a single set's consumer: PullConsumer or PopConsumer


class SetReaders(Generic[C]):
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
