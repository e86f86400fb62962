"""Spark scans of a cluster of broker sets: one and two broker sets, one and two Spark workers.

    python scripts/bench_spark_cluster.py                    # 400,000 messages of 100 bytes
    python scripts/bench_spark_cluster.py --messages 1000000

For each cluster size (one engine per set, a topic of 8 queues spread over the sets, filled
through ``ClusterProducer``) and each Spark standalone cluster (a master and 1 or 2 workers of
one core, from pyspark's launcher): a job reads the whole topic with option ``cluster`` and sums
the body lengths (every message pulled and decoded), three times; the best run is printed as
messages per second. Spark's own start is not counted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TOPIC, QUEUES = "scan", 8


def job(master: str, etcd: str, runs: int) -> None:
    """In a process of its own: the scans, as one JSON line."""
    from pyspark.sql import functions as F

    from engine.spark.session import build_session, stop_session

    spark = build_session(master=master, app_name="bench-spark-cluster",
                          conf={"spark.executor.memory": "1g", "spark.driver.host": "127.0.0.1"})
    try:
        seconds, count = [], 0
        for _ in range(runs):
            started = time.perf_counter()
            row = (spark.read.format("rmq").option("cluster", etcd).option("topics", TOPIC)
                   .option("maxRecordsPerPartition", 25_000).load()
                   .agg(F.count("*").alias("n"), F.sum(F.length("body")).alias("bytes")).collect()[0])
            seconds.append(time.perf_counter() - started)
            count = row["n"]
        print(json.dumps({"count": count, "seconds": seconds}))
    finally:
        stop_session(spark)


def fill(etcd: str, messages: int, size: int) -> None:
    from rmqpy import Cluster, ClusterProducer

    cluster = Cluster(etcd)
    cluster.create_topic(TOPIC, queue_count=QUEUES)
    per_thread = messages // 4 // 500

    def send() -> None:
        with ClusterProducer(cluster) as producer:
            for _ in range(per_thread):
                producer.send_batch(TOPIC, [b"x" * size] * 500)

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--job", nargs=2, metavar=("MASTER", "ETCD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        job(*args.job, args.runs)
        return
    from engine.config import StoreConfig
    from harness.broker_set import cluster_of_sets
    from harness.spark_cluster import spark_standalone

    config = StoreConfig().replace(flush_mode="ASYNC_FLUSH", metrics_endpoint="", auto_create_topic=False)
    rows = []
    for sets in (1, 2):
        with tempfile.TemporaryDirectory(prefix="bench-spark-cluster-") as scratch, \
                cluster_of_sets(Path(scratch) / "cluster", config, sets=sets, engines=1) as brokers:
            for broker_set in brokers:
                broker_set.wait_master()
            etcd = brokers[0].etcd.endpoints
            fill(etcd, args.messages, args.size)
            for workers in (1, 2):
                with spark_standalone(Path(scratch) / f"spark-{workers}", workers=workers) as master:
                    ran = subprocess.run([sys.executable, __file__, "--runs", str(args.runs), "--job", master, etcd],
                                         capture_output=True, text=True, check=True)
                result = json.loads(ran.stdout.strip().splitlines()[-1])
                best = min(result["seconds"])
                rows.append((sets, workers, result["count"], best))
                print(f"{sets} broker set(s), {workers} worker(s): {result['count']:,} messages in {best:.2f} s "
                      f"({result['count'] / best:,.0f} msg/s; runs {', '.join(f'{s:.2f}' for s in result['seconds'])})",
                      flush=True)
    print("\n| broker sets | Spark workers | messages | best scan s | msg/s |\n|---:|---:|---:|---:|---:|")
    for sets, workers, count, best in rows:
        print(f"| {sets} | {workers} | {count:,} | {best:.2f} | {count / best:,.0f} |")


if __name__ == "__main__":
    main()
