"""``topics``: list, create, grow or delete an engine's topics, or a cluster's spread topics in etcd."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from engine.cli.common import (
    EXIT_USAGE,
    add_command,
    add_connection_options,
    add_etcd_options,
    connect,
    emit,
    etcd_login,
    etcd_tls,
    positive,
)

EXAMPLES = """examples:
  %(prog)s
  %(prog)s --create orders --queues 8
  %(prog)s --delete orders
  %(prog)s --cluster http://127.0.0.1:2379 --create orders --queues 8 --brokers broker-a,broker-b"""


def run(args: argparse.Namespace) -> int:
    if args.cluster:
        return _cluster_topics(args)
    if args.brokers:
        print("error: --brokers spreads a topic over a cluster's broker sets: give --cluster too", file=sys.stderr)
        return 2
    with connect(args, timeout_ms=args.timeout_ms) as client:
        if args.create:
            created = client.create_topic(args.create, queue_count=args.queues)
            emit(args, created, f"topic {created['topic']} has {created['queue_count']} queues")
            return 0
        if args.delete:
            deleted = client.delete_topic(args.delete)
            emit(args, deleted, f"topic {deleted['topic']} deleted; its records stay in the log until retention")
            return 0
        topics = client.list_topics()
    emit(args, topics, "\n".join(f"{t['topic']}\t{t['queue_count']} queues" for t in topics) or "no topics")
    return 0


def _cluster_topics(args: argparse.Namespace) -> int:
    """``topics --cluster``: the routes in etcd; ``--create`` spreads a topic over broker sets."""
    from engine.coordination.etcd import Etcd, EtcdUnavailable
    from engine.coordination.routes import create_spread_topic, is_etcd_address, read_cluster

    if not is_etcd_address(args.cluster):
        print(f"error: topics --cluster lists and spreads topics in etcd: give its client endpoints "
              f"(http://host:port), not {args.cluster}", file=sys.stderr)
        return EXIT_USAGE
    etcd = Etcd(args.cluster.split(","), timeout_ms=min(args.timeout_ms, 3_000), tls=etcd_tls(args),
                login=etcd_login(args))
    try:
        if args.delete:
            print("error: delete a topic on each broker set that serves it (--endpoint)", file=sys.stderr)
            return 2
        if args.create:
            route = create_spread_topic(etcd, args.cluster_name, args.create, args.queues or 8,
                                        brokers=args.brokers.split(",") if args.brokers else None,
                                        timeout_ms=args.timeout_ms)
            facts = {"topic": route.topic, "brokers": [{"broker_name": b.broker_name, "queue_count": b.queue_count,
                                                        "master_endpoint": b.master_endpoint} for b in route.brokers]}
            emit(args, facts, "\n".join(f"topic {route.topic}: {b.queue_count} queues on {b.broker_name} "
                                         f"({b.master_endpoint})" for b in route.brokers))
            return 0
        cluster = read_cluster(etcd, args.cluster_name)
    except EtcdUnavailable as exc:
        print(f"error: {exc} (--cluster names etcd's client endpoints, http://host:port)", file=sys.stderr)
        return 1
    lines = [f"{topic}\t" + ", ".join(f"{broker}: {queues} queues" for broker, queues in sorted(brokers.items()))
             for topic, brokers in sorted(cluster["topics"].items())]
    emit(args, cluster, "\n".join(lines) or f"no topics in cluster {args.cluster_name!r}")
    return 0


def add(commands: Any) -> None:
    topics = add_command(commands, "topics", "list, create, grow or delete topics", EXAMPLES)
    add_connection_options(topics)
    action = topics.add_mutually_exclusive_group()
    action.add_argument("--create", metavar="TOPIC", help="create TOPIC, or grow it to --queues queues")
    action.add_argument("--delete", metavar="TOPIC", help="delete TOPIC: its queues and consumer offsets")
    topics.add_argument("--queues", type=positive, metavar="N",
                        help="with --create: the number of queues (default: the engine's topic_queue_count_default; "
                             "8 over a cluster)")
    cluster = topics.add_argument_group("a cluster of broker sets (docs/cluster.md)")
    cluster.add_argument("--cluster", metavar="URLS",
                         help="etcd's client endpoints (http://host:port, comma-separated): list the cluster's "
                              "routes, or spread --create's queues over its broker sets")
    cluster.add_argument("--cluster-name", default="DefaultCluster", help="the cluster (default DefaultCluster)")
    add_etcd_options(cluster)
    cluster.add_argument("--brokers", metavar="NAMES",
                         help="with --cluster --create: the broker sets to spread over (default: every one)")
    topics.set_defaults(handler=run)
