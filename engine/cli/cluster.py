"""``produce`` and ``consume`` over a cluster of broker sets (``--cluster ADDRESS``, docs/cluster.md).

The address is etcd's client endpoints (``http://host:port``) or any engine of the cluster: the
topic's route comes from either (``engine.coordination.routes.RouteReader``). ``produce`` sends
each batch to the next queue of the whole route, or with ``--sharding-key`` always to the queue
the key hashes to (``TopicRoute.send_order``), at that queue's broker set's master. ``consume``
reads each set in turn with the single-engine code, at the set's master, until ``--count``:
first every set without waiting, then, if nothing came, each set for its share of ``--wait-ms``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable
from typing import Any

from engine.cli.common import EXIT_FAILED, EXIT_USAGE
from engine.client import ClientError, StoreClient
from engine.coordination.etcd import EtcdUnavailable
from engine.coordination.routes import RouteReader, TopicRoute


def cluster_route(args: argparse.Namespace) -> TopicRoute:
    """The route of ``--topic`` in ``--cluster``; exits with a one-line error when there is none."""
    reader = RouteReader(args.cluster, cluster_name=args.cluster_name, timeout_ms=min(args.timeout_ms, 3_000))
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
    if masterless:
        print(f"error: broker set {', '.join(masterless)} has no master now (an election); try again",
              file=sys.stderr)
        raise SystemExit(EXIT_FAILED)
    return route


class SpreadSends:
    """Where each batch of ``produce --cluster`` goes: (client of the set's master, queue id, broker)."""

    client = None  # no engine of its own

    def __init__(self, args: argparse.Namespace, route: TopicRoute, connect: Callable[[str], StoreClient]) -> None:
        if args.queue_id is not None:
            print("error: --queue-id names one engine's queue; over a cluster give --sharding-key, or --endpoint "
                  "one set's master", file=sys.stderr)
            raise SystemExit(EXIT_USAGE)
        self.route = route
        self.connect = connect
        self.sharding_key: str | None = args.sharding_key
        self.clients: dict[str, StoreClient] = {}
        self.turn = itertools.count()

    def __enter__(self) -> SpreadSends:
        return self

    def __exit__(self, *exc: object) -> None:
        for client in self.clients.values():
            client.close()

    def next(self) -> tuple[StoreClient, int, str]:
        broker, queue_id = self.route.send_order(self.sharding_key, next(self.turn))[0]
        client = self.clients.get(broker)
        if client is None:
            [master] = [b.master_endpoint for b in self.route.brokers if b.broker_name == broker]
            client = self.clients[broker] = self.connect(master)
        return client, queue_id, broker


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
