"""A topic spread over a cluster's broker sets is routed whole by every engine as soon as its create
returns (engine/coordination/routes.py, ``create_spread_topic``): each engine mirrors etcd's routes
only every ``cluster_routes_refresh_ms``, and a consume over an engine right after the create read
the sets its mirror had, one of two, without saying so."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.config import StoreConfig
from harness.broker_set import BrokerSet, cluster_of_sets
from harness.workload import wait_dispatched
from rmqpy import Cluster
from supervisor.etcd_server import ETCD
from tests.helpers import require

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

CLI = [sys.executable, "-m", "engine"]


@pytest.fixture
def sets(tmp_path: Path) -> Iterator[list[BrokerSet]]:
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    config = StoreConfig.test_min().replace(auto_create_topic=False, cluster_routes_refresh_ms=5_000)
    # 5 s: the mirrors' window of the default 2 s, widened so that a loaded machine shows it too
    with cluster_of_sets(tmp_path, config, sets=2, engines=1) as brokers:
        for broker_set in brokers:
            broker_set.wait_master()
        yield brokers


def test_a_consume_over_an_engine_right_after_the_create_reads_every_set(sets: list[BrokerSet]) -> None:
    engines = [engine for broker_set in sets for engine in broker_set.engines]
    clients = [engine.client() for engine in engines]  # connected before: the reads follow the create at once
    try:
        with Cluster(sets[0].etcd.endpoints) as cluster:
            cluster.create_topic("orders", queue_count=8)
        routes = [client.request("route", topic="orders")["topic_route"] for client in clients]
    finally:
        for client in clients:
            client.close()
    for engine, route in zip(engines, routes, strict=True):
        assert [(r["broker_name"], r["queues"]) for r in route] == [("broker-a", 4), ("broker-b", 4)], \
            f"{engine.endpoint} routes orders to {route}"
    for k, broker_set in enumerate(sets):
        with broker_set.engines[0].client() as client:
            for queue_id in range(4):
                client.send("orders", [{"body": f"{k}-{queue_id}".encode()}], queue_id=queue_id)
            wait_dispatched(client)
    consumed = subprocess.run([*CLI, "consume", "--cluster", engines[1].endpoint, "--topic", "orders",
                               "--count", "100", "--json"], capture_output=True, text=True, timeout=60, check=True)
    messages = json.loads(consumed.stdout)
    assert Counter(m["broker_name"] for m in messages) == {"broker-a": 4, "broker-b": 4}
