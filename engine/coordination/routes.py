"""Topic routes in etcd: which broker sets serve a topic, and with how many queues each
(RocketMQ's NameServer, on the etcd that already elects each broker set's master).

Keys (values are JSON)::

    /rmqpy-routes/<cluster_name>/<topic>/<broker_name>    {"queues": n}

A broker set's master writes its own (``RoutePublisher``, run by the broker membership
actor): one key per topic in its topic table (``config/topics.json``), the engine's own
topics left out; a deleted topic's key goes. The keys have no lease: a topic stays on its
broker set while the set changes master, and the set's ``master`` key
(``engine/coordination/broker_set.py``) says where it takes writes now. A topic's queues on
one broker set are that set's queues 0..n-1: a queue of the cluster is (broker_name, queue
id), as in RocketMQ's ``MessageQueue``.

``topic_route`` reads a topic's route with every broker set's master and replicas, for the
clients that route (``rmqpy/cluster.py``). Every engine's membership actor also mirrors the
whole cluster's routes into its run directory (``routes_mirror.py``), for its front: a
request for a topic this set does not serve is refused with the sets that do, and the
``route`` op answers a topic's route from any engine of the cluster.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.client import ClientError, EngineError, EngineUnreachable, RequestTimeout, StoreClient, engine_answers
from engine.coordination.broker_set import BrokerSetKeys
from engine.coordination.etcd import Etcd, EtcdLogin, EtcdTls, delete
from engine.errors import ErrorCode
from engine.ipc.curve import CurveKeys
from engine.store.system_topics import SYSTEM_TOPICS
from engine.store.topics import TOPICS_FILE, TopicTable

log = logging.getLogger(__name__)

ROUTES_ROOT = "/rmqpy-routes/"
CHANGES_PER_TURN_MAX = 64  # route keys written per call of ``publish``: the rest at the next


def routes_prefix(cluster_name: str, topic: str | None = None) -> str:
    return f"{ROUTES_ROOT}{cluster_name}/" + ("" if topic is None else f"{topic}/")


@dataclass(frozen=True)
class BrokerRoute:
    """A topic's queues on one broker set, and where that set is reached."""

    broker_name: str
    queue_count: int
    master_endpoint: str  # "" while the set has no master
    replica_endpoints: tuple[str, ...] = ()
    grpc_endpoint: str = ""


@dataclass(frozen=True)
class TopicRoute:
    topic: str
    brokers: tuple[BrokerRoute, ...] = field(default_factory=tuple)  # sorted by broker name

    @property
    def queues(self) -> list[tuple[str, int]]:
        """Every queue of the topic in the cluster, as (broker name, queue id), in a fixed order."""
        return [(b.broker_name, q) for b in self.brokers for q in range(b.queue_count)]

    def send_order(self, sharding_key: str | None, turn: int) -> list[tuple[str, int]]:
        """Every queue, in the order a send tries them: first the queue ``sharding_key`` hashes to
        (the same key, the same queue of the same set: per-key order), or without a key the
        ``turn``-th (round robin over the whole route); then the queues after it, for a send
        passed over from a set that took nothing. The one queue choice of a cluster's senders."""
        queues = self.queues
        assert queues, f"the route of {self.topic!r} has no queue to send to"
        start = (zlib.crc32(sharding_key.encode()) if sharding_key is not None else turn) % len(queues)
        return queues[start:] + queues[:start]


def is_etcd_address(address: str) -> bool:
    """A cluster's address is etcd's client endpoints (``http://host:port``) or any of its engines
    (``tcp://host:port``, ``ipc://path``)."""
    return address.strip().startswith(("http://", "https://"))


def route_from_reply(topic: str, topic_route: list[dict[str, Any]]) -> TopicRoute:
    """A topic's route as an engine's ``route`` op gives it (``topic_route``: no replica endpoints)."""
    return TopicRoute(topic, tuple(sorted((BrokerRoute(r["broker_name"], r["queues"], r["master_endpoint"], (),
                                                       r.get("grpc_endpoint", "")) for r in topic_route),
                                          key=lambda b: b.broker_name)))


class RouteReader:
    """Topic routes from a cluster's address: etcd's client endpoints (comma-separated), or any
    engine of the cluster, whose ``route`` op answers from the routes it mirrors (no replica
    endpoints then). Thread-safe. ``topic_route`` raises ``EtcdUnavailable``, ``EngineUnreachable``
    or ``RequestTimeout`` when the address does not answer."""

    def __init__(self, address: str | Iterable[str], *, cluster_name: str, timeout_ms: int,
                 tls: EtcdTls | None = None, login: EtcdLogin | None = None, curve: CurveKeys | None = None) -> None:
        endpoints = [e.strip() for e in (address.split(",") if isinstance(address, str) else address) if e.strip()]
        if not endpoints:
            raise ValueError("a cluster's address names etcd's endpoints (http://host:port) or an engine (tcp://...)")
        self.address = ",".join(endpoints)
        self.cluster_name = cluster_name
        self.timeout_ms = timeout_ms
        self.etcd = Etcd(endpoints, timeout_ms=timeout_ms, tls=tls, login=login) \
            if is_etcd_address(endpoints[0]) else None
        self.engine = None if self.etcd is not None else endpoints[0]
        self.curve = curve
        self._client: StoreClient | None = None
        self._lock = threading.Lock()  # one request at a time on the engine's socket

    def topic_route(self, topic: str) -> TopicRoute:
        if self.etcd is not None:
            return topic_route(self.etcd, self.cluster_name, topic)
        assert self.engine is not None
        with self._lock:
            if self._client is None:
                self._client = StoreClient(self.engine, timeout_ms=self.timeout_ms, curve=self.curve)
            try:
                reply = self._client.request("route", topic=topic)
            except (EngineUnreachable, RequestTimeout):
                self._client.close()  # a new socket next time: no late reply is taken for the next request
                self._client = None
                raise
        return route_from_reply(topic, reply.get("topic_route", []))

    def require_etcd(self, what: str) -> Etcd:
        if self.etcd is None:
            raise ClientError(f"{what} needs the cluster's etcd endpoints (http://host:port), not an engine "
                              f"({self.engine})")
        return self.etcd

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def topic_route(etcd: Etcd, cluster_name: str, topic: str) -> TopicRoute:
    """The topic's route now (no broker: the cluster has no such topic)."""
    brokers = []
    prefix = routes_prefix(cluster_name, topic)
    for entry in etcd.get_prefix(prefix):
        broker_name = entry.key[len(prefix):]
        keys = BrokerSetKeys(cluster_name, broker_name)
        master = etcd.get(keys.master)
        master_value: dict[str, Any] = master.value if master is not None else {}
        replicas = tuple(sorted(member.value["endpoint"] for member in etcd.get_prefix(keys.members)
                                if member.value["broker_id"] != master_value.get("broker_id")))
        brokers.append(BrokerRoute(broker_name, entry.value["queues"], master_value.get("endpoint", ""), replicas,
                                   master_value.get("grpc_endpoint", "")))
    return TopicRoute(topic, tuple(sorted(brokers, key=lambda b: b.broker_name)))


def master_records(etcd: Etcd, cluster_name: str) -> dict[str, dict[str, Any]]:
    """Every broker set of the cluster that has a master now: broker name -> its ``master`` key's value."""
    prefix = f"/rmqpy/{cluster_name}/"
    return {entry.key[len(prefix):-len("/master")]: entry.value
            for entry in etcd.get_prefix(prefix) if entry.key.endswith("/master") and entry.key.count("/") == 4}


def broker_masters(etcd: Etcd, cluster_name: str) -> dict[str, str]:
    """Every broker set of the cluster that has a master now: broker name -> its client endpoint."""
    return {broker: record["endpoint"] for broker, record in master_records(etcd, cluster_name).items()}


def create_spread_topic(etcd: Etcd, cluster_name: str, topic: str, queue_count: int, *,
                        brokers: Iterable[str] | None = None, timeout_ms: int = 3_000,
                        wait_ms: int = 10_000) -> TopicRoute:
    """Spread ``queue_count`` queues of ``topic`` over ``brokers`` (default: every set with a master) as
    evenly as can be, by ``create_topic`` on each set's master, and wait until the route says so: in
    etcd, then in the routes every engine of the cluster mirrors (``wait_mirrored``), so that a route
    read from any engine right after is whole. A set that has the topic already keeps its queues if
    it has more (they only grow)."""
    masters = broker_masters(etcd, cluster_name)
    chosen = sorted(masters if brokers is None else set(brokers))
    missing = [name for name in chosen if name not in masters]
    if missing or not chosen:
        raise EngineError(ErrorCode.SERVICE_NOT_AVAILABLE, ErrorCode.SERVICE_NOT_AVAILABLE.name,
                          f"no master for broker sets {missing or '(none)'}; sets with one: {sorted(masters)}")
    if queue_count < len(chosen):
        raise EngineError(ErrorCode.INVALID_FIELD, ErrorCode.INVALID_FIELD.name,
                          f"{queue_count} queues cannot be spread over {len(chosen)} broker sets")
    shares = {name: queue_count // len(chosen) + (1 if k < queue_count % len(chosen) else 0)
              for k, name in enumerate(chosen)}
    for name, share in shares.items():
        with StoreClient(masters[name], timeout_ms=timeout_ms) as client:
            client.create_topic(topic, queue_count=share)
    deadline = time.monotonic() + wait_ms / 1000
    while True:  # each set's master publishes its topic table within a tick or two
        route = topic_route(etcd, cluster_name, topic)
        counts = {b.broker_name: b.queue_count for b in route.brokers}
        if all(counts.get(name, 0) >= share for name, share in shares.items()):
            wait_mirrored(cluster_engines(etcd, cluster_name), route, deadline, timeout_ms=timeout_ms)
            return route
        if time.monotonic() > deadline:
            raise EngineError(ErrorCode.TIMEOUT, ErrorCode.TIMEOUT.name,
                              f"topic {topic!r} created, but its route in etcd says {counts}, not {shares}")
        time.sleep(0.05)


def cluster_engines(etcd: Etcd, cluster_name: str) -> list[str]:
    """The client endpoint of every engine of the cluster whose membership lease is alive."""
    prefix = f"/rmqpy/{cluster_name}/"
    return sorted({entry.value["endpoint"] for entry in etcd.get_prefix(prefix)
                   if entry.key[len(prefix):].partition("/")[2].startswith("members/")})


def wait_mirrored(engines: Iterable[str], route: TopicRoute, deadline: float, *, timeout_ms: int) -> None:
    """Until each of ``engines`` answers ``route`` op for the topic with at least the queues of every
    set ``route`` names. Each engine mirrors etcd's routes every ``cluster_routes_refresh_ms``
    (``routes_mirror.py``), and one read meanwhile named only the sets its mirror had (a consume
    read one set of two, silently). An engine that does not answer is left out: it reads the
    routes again as it starts. TIMEOUT past ``deadline`` (monotonic seconds), naming the engines."""
    wanted = {b.broker_name: b.queue_count for b in route.brokers}
    pending: dict[str, StoreClient] = {}
    try:
        for endpoint in engines:
            if engine_answers(endpoint):
                pending[endpoint] = StoreClient(endpoint, timeout_ms=timeout_ms)
        while pending:
            for endpoint, client in list(pending.items()):
                try:
                    served = client.request("route", topic=route.topic).get("topic_route", [])
                except (EngineUnreachable, RequestTimeout) as exc:
                    log.warning("%s left out of the wait for the route of %r: %s", endpoint, route.topic, exc)
                    served = None
                counts = {r["broker_name"]: r["queues"] for r in served or []}
                if served is None or all(counts.get(name, 0) >= queues for name, queues in wanted.items()):
                    pending.pop(endpoint).close()
            if pending and time.monotonic() > deadline:
                raise EngineError(ErrorCode.TIMEOUT, ErrorCode.TIMEOUT.name,
                                  f"topic {route.topic!r} created and in etcd, but engines {sorted(pending)} do not "
                                  f"route it to every set yet")
            if pending:
                time.sleep(0.05)  # the engines' mirrors catch up within cluster_routes_refresh_ms
    finally:
        for client in pending.values():
            client.close()


class RoutePublisher:
    """Keeps this broker set's route keys equal to its topic table (the master calls ``publish``)."""

    def __init__(self, etcd: Etcd, cluster_name: str, broker_name: str, store_dir: Path) -> None:
        self.etcd = etcd
        self.cluster_name = cluster_name
        self.broker_name = broker_name
        self.store_dir = store_dir
        self.table_stamp: tuple[int, int] | None = None  # the topic table file's (mtime ns, size) last read
        self.wanted: dict[str, int] = {}  # topic -> queue count, by the topic table
        self.published: dict[str, int] | None = None  # what etcd holds for this broker set (None: not read yet)

    def publish(self) -> int:
        """Bring the keys up to date, at most ``CHANGES_PER_TURN_MAX`` of them; how many changed."""
        self._read_table()
        if self.published is None:
            self.published = self._read_published()
        changes = [(topic, count) for topic, count in self.wanted.items() if self.published.get(topic) != count]
        changes += [(topic, 0) for topic in self.published if topic not in self.wanted]
        for topic, count in changes[:CHANGES_PER_TURN_MAX]:
            key = routes_prefix(self.cluster_name, topic) + self.broker_name
            if count:
                self.etcd.put(key, {"queues": count})
                self.published[topic] = count
            else:
                self.etcd.transaction([], [delete(key)])
                del self.published[topic]
        if changes:
            log.info("routes of %d topics published (%d to go)", min(len(changes), CHANGES_PER_TURN_MAX),
                     max(0, len(changes) - CHANGES_PER_TURN_MAX))
        return min(len(changes), CHANGES_PER_TURN_MAX)

    def stepped_down(self) -> None:
        """No longer master: read etcd again before the next publication (another master may have written)."""
        self.published = None

    def _read_table(self) -> None:
        path = self.store_dir / TOPICS_FILE
        try:
            stat = path.stat()
        except FileNotFoundError:
            return
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self.table_stamp:
            self.table_stamp = stamp
            self.wanted = {name: config.write_queue_nums for name, config in TopicTable(self.store_dir).topics.items()
                           if name not in SYSTEM_TOPICS}

    def _read_published(self) -> dict[str, int]:
        prefix = routes_prefix(self.cluster_name)
        suffix = "/" + self.broker_name
        return {entry.key[len(prefix):-len(suffix)]: entry.value["queues"]
                for entry in self.etcd.get_prefix(prefix) if entry.key.endswith(suffix)}


# -- the cluster's routes, mirrored for the front --------------------------------------------------



def read_cluster(etcd: Etcd, cluster_name: str) -> dict[str, Any]:
    """Every topic's route in the cluster and every set's master: what the mirror file holds."""
    prefix = routes_prefix(cluster_name)
    topics: dict[str, dict[str, int]] = {}
    for entry in etcd.get_prefix(prefix):
        topic, _, broker = entry.key[len(prefix):].partition("/")
        topics.setdefault(topic, {})[broker] = entry.value["queues"]
    records = master_records(etcd, cluster_name)
    return {"topics": topics, "masters": {broker: record["endpoint"] for broker, record in records.items()},
            "grpc": {broker: record.get("grpc_endpoint", "") for broker, record in records.items()}}
