"""A cluster of two broker sets on one etcd (docs/cluster.md): each set's master publishes the topics
it serves, a topic's queues spread over both, rmqpy's cluster clients send to every queue of the
route and a consumer group of members reads from both sets, each message once.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.client import EngineError
from engine.config import StoreConfig
from engine.coordination.routes import routes_prefix
from engine.errors import ErrorCode
from harness.broker_set import BrokerSet, cluster_of_sets
from rmqpy.cluster import Cluster, ClusterProducer, ClusterPullConsumer
from supervisor.etcd_server import ETCD
from tests.helpers import require

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def sets(tmp_path: Path) -> Iterator[list[BrokerSet]]:
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    config = StoreConfig.test_min().replace(consumer_session_timeout_ms=1_500, auto_create_topic=False)
    with cluster_of_sets(tmp_path, config, sets=2, engines=1) as brokers:
        for broker_set in brokers:
            broker_set.wait_master()
        yield brokers


def test_a_topic_spread_over_two_sets_gets_messages_on_every_queue_and_a_group_reads_each_once(
        sets: list[BrokerSet]) -> None:
    cluster = Cluster(sets[0].etcd.endpoints)
    route = cluster.create_topic("orders", queue_count=8)
    assert [(b.broker_name, b.queue_count) for b in route.brokers] == [("broker-a", 4), ("broker-b", 4)]
    assert route.brokers[0].master_endpoint == sets[0].engines[0].endpoint
    assert len(route.queues) == 8

    with ClusterProducer(cluster) as producer:
        results = [producer.send("orders", f"m-{i}".encode()) for i in range(200)]
        keyed = {producer.send("orders", b"k", sharding_key="customer-7").broker_name for _ in range(5)}
    assert Counter((r.broker_name, r.queue_id) for r in results) == dict.fromkeys(route.queues, 25)
    assert len(keyed) == 1, "one sharding key, one queue of one set"

    expected = {f"m-{i}" for i in range(200)} | {"k"}
    read: Counter[str] = Counter()
    members = [ClusterPullConsumer(cluster, "billing", "orders", commit_every=1) for _ in range(2)]
    try:
        deadline = time.monotonic() + 30
        while set(read) != expected or not all(sum(map(len, m.queues().values())) == 4 for m in members):
            for member in members:
                read.update(m.body.decode() for m in member.poll(50))
            assert time.monotonic() < deadline, (len(read), [m.queues() for m in members])
        for member in members:
            assert sorted(member.queues()) == ["broker-a", "broker-b"]
            assert all(len(queues) == 2 for queues in member.queues().values()), member.queues()
    finally:
        for member in members:
            member.close()
    assert all(count == 1 for body, count in read.items() if body != "k"), "each message read once"


def test_routes_follow_the_topic_table_and_a_set_without_the_topic_is_named(sets: list[BrokerSet]) -> None:
    cluster = Cluster(sets[0].etcd.endpoints)
    with pytest.raises(EngineError) as missing:
        cluster.route("nowhere")
    assert missing.value.code == ErrorCode.TOPIC_NOT_FOUND
    route = cluster.create_topic("only-b", queue_count=3, brokers=["broker-b"])
    assert [(b.broker_name, b.queue_count) for b in route.brokers] == [("broker-b", 3)]
    with ClusterProducer(cluster) as producer:
        assert {producer.send("only-b", b"x").broker_name for _ in range(6)} == {"broker-b"}
    b_endpoint = sets[1].engines[0].endpoint
    with sets[0].engines[0].client() as a:
        deadline = time.monotonic() + 10
        while True:  # each engine mirrors the cluster's routes every cluster_routes_refresh_ms
            with pytest.raises(EngineError) as refused:
                a.send("only-b", [{"body": b"x"}])
            assert refused.value.code == ErrorCode.TOPIC_NOT_FOUND
            if "broker-b" in str(refused.value):
                break
            assert time.monotonic() < deadline, "broker-a's refusal does not name broker-b"
            time.sleep(0.05)
        assert refused.value.details == {"brokers": "broker-b", "master_endpoints": b_endpoint}
        assert a.request("route", topic="only-b")["topic_route"] == [
            {"broker_name": "broker-b", "queues": 3, "master_endpoint": b_endpoint}], "any engine answers the route"
    with sets[1].engines[0].client() as b:  # deleted on its set: its route goes
        b.request("delete_topic", topic="only-b")
    deadline = time.monotonic() + 10
    while cluster.etcd.get_prefix(routes_prefix(cluster.cluster_name, "only-b")):
        assert time.monotonic() < deadline, "the deleted topic's route stayed"
        time.sleep(0.05)
