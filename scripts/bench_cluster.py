"""Produce and consume through the cluster clients, with one broker set and with two.

    python scripts/bench_cluster.py                      # 200,000 messages of 100 bytes
    python scripts/bench_cluster.py --messages 1000000 --threads 4

For each cluster size: etcd and the broker sets (one engine each, ASYNC_FLUSH, no replicas:
the figure is the sets', not replication's) on this machine, a topic of 8 queues spread over
the sets, ``--threads`` threads each sending batches of ``--batch`` through a
``ClusterProducer`` (round robin over the whole route), then one ``ClusterPullConsumer``
reading everything back from the start. Printed: messages per second both ways.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.config import StoreConfig
from harness.broker_set import cluster_of_sets
from rmqpy import Cluster, ClusterProducer, ClusterPullConsumer

TOPIC, QUEUES = "bench", 8


def produce(cluster: Cluster, messages: int, threads: int, batch: int, size: int) -> float:
    body = b"x" * size
    per_thread = messages // threads // batch

    def run() -> None:
        with ClusterProducer(cluster) as producer:
            for _ in range(per_thread):
                producer.send_batch(TOPIC, [body] * batch)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return per_thread * batch * threads / (time.perf_counter() - start)


def consume(cluster: Cluster, expected: int) -> float:
    start = time.perf_counter()
    read = 0
    with ClusterPullConsumer(cluster, "bench", TOPIC, batch_size=256, auto_commit=False) as consumer:
        while read < expected:
            read += len(consumer.poll(5_000, max_messages=1_024))
    return read / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--size", type=int, default=100)
    args = parser.parse_args()
    config = StoreConfig().replace(flush_mode="ASYNC_FLUSH", metrics_endpoint="", auto_create_topic=False)
    rows = []
    for sets in (1, 2):
        with tempfile.TemporaryDirectory(prefix="bench-cluster-") as scratch, \
                cluster_of_sets(Path(scratch), config, sets=sets, engines=1) as brokers:
            for broker_set in brokers:
                broker_set.wait_master()
            cluster = Cluster(brokers[0].etcd.endpoints)
            cluster.create_topic(TOPIC, queue_count=QUEUES)
            sent = produce(cluster, args.messages, args.threads, args.batch, args.size)
            total = args.messages // args.threads // args.batch * args.batch * args.threads
            read = consume(cluster, total)
            rows.append((sets, sent, read))
            print(f"{sets} broker set(s): produce {sent:,.0f} msg/s, consume {read:,.0f} msg/s", flush=True)
    print(f"\n{args.messages:,} messages of {args.size} B, {args.threads} threads sending batches of {args.batch}")
    print("| broker sets | produce msg/s | consume msg/s |\n|---:|---:|---:|")
    for sets, sent, read in rows:
        print(f"| {sets} | {sent:,.0f} | {read:,.0f} |")


if __name__ == "__main__":
    main()
