"""The C and Node clients over a cluster of two broker sets (docs/cluster.md): given one engine,
each reads a topic's route as the Python client does and spreads its sends over every queue of
both sets. The clients are run through their conformance drivers (see test_clients.py), which
take the ops ``topic_route`` and ``cluster_send``.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.config import StoreConfig
from harness.broker_set import BrokerSet, cluster_of_sets, wait_route_known
from rmqpy.cluster import Cluster
from supervisor.etcd_server import ETCD
from tests.conformance.test_clients import b64, drive, require_drivers
from tests.helpers import require

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # etcd and two engines

ROUTERS = ("c", "node")


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[BrokerSet]]:
    require_drivers()
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    root: Path = tmp_path_factory.mktemp("route-a-cluster")
    with cluster_of_sets(root, StoreConfig.test_min().replace(auto_create_topic=False), sets=2) as brokers:
        for broker_set in brokers:
            broker_set.wait_master()
        Cluster(brokers[0].etcd.endpoints).create_topic("spread", queue_count=6)
        for broker_set in brokers:
            wait_route_known(broker_set.engines[0], "spread", 2)
        yield brokers


def test_every_client_reads_the_topic_route_the_python_client_reads(two_sets: list[BrokerSet]) -> None:
    b = two_sets[1].engines[0]
    with b.client() as client:  # any engine answers, from the routes it mirrors
        expected = client.request("route", topic="spread")["topic_route"]
    assert [s["broker_name"] for s in expected] == ["broker-a", "broker-b"]
    wanted = [{k: s[k] for k in ("broker_name", "queues", "master_endpoint")} for s in expected]
    for router in ROUTERS:
        [route, missing] = drive(router, b.endpoint, [{"op": "topic_route", "topic": "spread"},
                                                      {"op": "topic_route", "topic": "nowhere"}])
        assert route == {"ok": True, "sets": wanted}, (router, route)
        assert missing == {"ok": True, "sets": []}, (router, missing)


def test_every_client_spreads_its_sends_over_every_queue_of_both_sets(two_sets: list[BrokerSet]) -> None:
    a = two_sets[0].engines[0]
    for router in ROUTERS:
        [sent, refused] = drive(router, a.endpoint, [
            {"op": "cluster_send", "topic": "spread", "count": 12, "body_b64": b64(f"{router} spread".encode())},
            {"op": "cluster_send", "topic": "nowhere", "body_b64": b64(b"x")}])
        assert sent["ok"], (router, sent)
        assert Counter((s["broker_name"], s["queue_id"]) for s in sent["sent"]) == {
            (broker, q): 2 for broker in ("broker-a", "broker-b") for q in range(3)}, (router, sent)
        assert (refused["ok"], refused["name"]) == (False, "TOPIC_NOT_FOUND"), (router, refused)
    for broker_set in two_sets:
        with broker_set.engines[0].client() as client:
            stored = sum(client.queue_stats("spread", q)["max_offset"] for q in range(3))
        assert stored == 12, (broker_set.engines[0].config.broker_name, stored)
