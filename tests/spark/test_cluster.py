"""The connector over a cluster of two broker sets (docs/cluster.md): the batch read, the streaming
read and the sink, run as one program (tests/spark/cluster_job.py) on ``local[2]`` and on a Spark
standalone cluster of a master and two workers started from pyspark's launcher (slow)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.config import StoreConfig
from harness.broker_set import BrokerSet, cluster_of_sets
from harness.spark_cluster import spark_standalone
from rmqpy import Cluster, ClusterProducer
from supervisor.etcd_server import ETCD
from tests.helpers import require

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # etcd, two engines and a Spark job per test
JOB = Path(__file__).with_name("cluster_job.py")


@pytest.fixture
def two_sets(tmp_path: Path) -> Iterator[list[BrokerSet]]:
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    with cluster_of_sets(tmp_path / "cluster", StoreConfig.test_min().replace(auto_create_topic=False), sets=2,
                         engines=1) as brokers:
        for broker_set in brokers:
            broker_set.wait_master()
        cluster = Cluster(brokers[0].etcd.endpoints)
        cluster.create_topic("events", queue_count=4)
        cluster.create_topic("sunk", queue_count=4)
        with ClusterProducer(cluster) as producer:
            for n in range(120):
                producer.send("events", f"e-{n}".encode())
        yield brokers


def run_jobs(master: str, brokers: list[BrokerSet], out: Path) -> dict[str, Any]:
    ran = subprocess.run([sys.executable, str(JOB), master, brokers[0].etcd.endpoints, "events", "sunk", str(out)],
                         capture_output=True, text=True, timeout=240, check=False)
    assert ran.returncode == 0, ran.stderr[-3000:]
    result: dict[str, Any] = json.loads(ran.stdout.strip().splitlines()[-1])
    return result


def check(result: dict[str, Any], brokers: list[BrokerSet]) -> None:
    expected = sorted(f"e-{n}" for n in range(120))
    assert sorted(result["batch"]) == expected, "the batch read gets every message once"
    assert result["topics"] == ["events"], "rows keep the plain topic"
    assert len(result["hosts"]) == 2, "messages of both broker sets"
    assert sorted(result["streamed"]) == expected, "the streaming read too"
    assert result["offset_keys"] == ["events@broker-a", "events@broker-b"], "offsets name each set's queues"
    sunk = 0
    for broker_set in brokers:
        with broker_set.engines[0].client() as client:
            stored = sum(client.queue_stats("sunk", q)["max_offset"] for q in range(2))
            assert stored > 0, "the sink writes to both sets"
            sunk += stored
    assert sunk == 100


def test_batch_stream_and_sink_over_two_broker_sets_on_local_spark(two_sets: list[BrokerSet], tmp_path: Path) -> None:
    check(run_jobs("local[2]", two_sets, tmp_path / "out"), two_sets)


def test_the_same_jobs_on_a_spark_standalone_cluster_of_two_workers(two_sets: list[BrokerSet], tmp_path: Path) -> None:
    with spark_standalone(tmp_path / "spark", workers=2) as master:
        check(run_jobs(master, two_sets, tmp_path / "out"), two_sets)
