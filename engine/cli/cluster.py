"""``produce`` and ``consume`` over a cluster of broker sets (``--cluster ADDRESS``, docs/cluster.md).

The address is etcd's client endpoints (``http://host:port``) or any engine of the cluster: the
topic's route comes from either (``engine.coordination.routes.RouteReader``). ``produce`` sends
each batch to the next queue of the whole route, or with ``--sharding-key`` always to the queue
the key hashes to (``TopicRoute.send_order``), at that queue's broker set's master (following it
across a failover; a keyless batch goes to another set while one has none). ``consume``
reads each set in turn with the single-engine code, at the set's master, until ``--count``:
first every set without waiting, then, if nothing came, each set for its share of ``--wait-ms``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable
from typing import Any

from engine.cli.common import EXIT_FAILED, EXIT_USAGE, etcd_login, etcd_tls
from engine.client import ClientError, EngineUnreachable, StoreClient
from engine.coordination.etcd import EtcdUnavailable
from engine.coordination.routes import RouteReader, TopicRoute
from engine.ipc.curve import CurveKeys
from rmqpy.errors import NoMaster
from rmqpy.raw import SetClient

SET_PASSED_OVER_MS = 1_000  # how long produce --cluster leaves a set without a master to the others


def cluster_route(args: argparse.Namespace, *, masters_required: bool = True) -> TopicRoute:
    """The route of ``--topic`` in ``--cluster``; exits with a one-line error when there is none (or,
    with ``masters_required``, when a set of it has no master now)."""
    reader = RouteReader(args.cluster, cluster_name=args.cluster_name, timeout_ms=min(args.timeout_ms, 3_000),
                         tls=etcd_tls(args), login=etcd_login(args))
    try:
        route = reader.topic_route(args.topic)
    except (EtcdUnavailable, ClientError) as exc:
        print(f"error: the cluster at {args.cluster} does not answer: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_FAILED) from None
    finally:
        reader.close()
    if not route.brokers:
        print(f"error: no broker set of cluster {args.cluster_name!r} serves topic {args.topic!r} (create it over "
              f"the sets: topics --cluster ETCD --create {args.topic})", file=sys.stderr)
        raise SystemExit(EXIT_FAILED)
    masterless = [b.broker_name for b in route.brokers if not b.master_endpoint]
    if masterless and (masters_required or len(masterless) == len(route.brokers)):
        print(f"error: broker set {', '.join(masterless)} has no master now (an election); try again",
              file=sys.stderr)
        raise SystemExit(EXIT_FAILED)
    return route


class SpreadSends:
    """Where each batch of ``produce --cluster`` goes: the next queue of the route, or the one
    ``--sharding-key`` hashes to, through a client of that set's address (``SetClient``: its master,
    across a failover). A keyless batch whose set has no master now goes to the next queue of
    another set, and that set is passed over for ``SET_PASSED_OVER_MS``."""

    client = None  # no engine of its own

    def __init__(self, args: argparse.Namespace, route: TopicRoute, curve: CurveKeys | None) -> None:
        if args.queue_id is not None:
            print("error: --queue-id names one engine's queue; over a cluster give --sharding-key, or --endpoint "
                  "one set's master", file=sys.stderr)
            raise SystemExit(EXIT_USAGE)
        self.route = route
        self.timeout_ms: int = args.timeout_ms
        self.curve = curve
        self.sharding_key: str | None = args.sharding_key
        self.clients: dict[str, SetClient] = {}
        self.passed_over: dict[str, float] = {}  # broker -> until when (monotonic)
        self.turn = itertools.count()

    def __enter__(self) -> SpreadSends:
        return self

    def __exit__(self, *exc: object) -> None:
        for client in self.clients.values():
            client.close()

    def send(self, topic: str, batch: list[dict[str, Any]], **fields: Any) -> tuple[StoreClient, list[Any], str]:
        """The batch sent: (the client that took it, its results, the broker set)."""
        now = time.monotonic()
        order = self.route.send_order(self.sharding_key, next(self.turn))
        if self.sharding_key is not None:
            order = order[:1]
        order.sort(key=lambda queue: self.passed_over.get(queue[0], 0.0) > now)  # a stable sort
        failure: ClientError | None = None
        tried: set[str] = set()
        for broker, queue_id in order:
            if broker in tried:
                continue
            tried.add(broker)
            client = self._client(broker)
            try:
                return client, client.send(topic, batch, queue_id=queue_id, **fields), broker
            except (NoMaster, EngineUnreachable) as exc:
                failure = exc
                self.passed_over[broker] = time.monotonic() + SET_PASSED_OVER_MS / 1000
                print(f"note: broker set {broker} has no master now: its batches go to the other sets",
                      file=sys.stderr)
        assert failure is not None
        raise failure

    def _client(self, broker: str) -> SetClient:
        client = self.clients.get(broker)
        if client is None:
            [set_] = [b for b in self.route.brokers if b.broker_name == broker]
            address = ",".join(e for e in (set_.master_endpoint, *set_.replica_endpoints) if e)
            client = self.clients[broker] = SetClient(address, timeout_ms=self.timeout_ms, curve=self.curve,
                                                      wait_for_master=self.sharding_key is not None)
        return client


def consume_sets(args: argparse.Namespace, route: TopicRoute,
                 consume_one: Callable[[argparse.Namespace], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """``consume_one`` (the single-engine consume, given an engine and a count) at each set's master,
    its messages named by broker set, up to ``--count`` in all."""
    messages: list[dict[str, Any]] = []
    wait_ms = getattr(args, "wait_ms", 0)
    for waiting_ms in (0, wait_ms // len(route.brokers)) if wait_ms else (0,):
        for broker in route.brokers:
            if len(messages) >= args.count:
                return messages
            one = argparse.Namespace(**{**vars(args), "endpoint": broker.master_endpoint, "cluster": None,
                                        "count": args.count - len(messages), "wait_ms": waiting_ms})
            messages += [{**m, "broker_name": broker.broker_name} for m in consume_one(one)]
        if messages:
            return messages
    return messages
