"""The Spark jobs of the cluster tests, as a program of its own (one SparkSession per process, so the
same jobs run on a standalone cluster and on ``local[*]``):

    python tests/spark/cluster_job.py MASTER ETCD TOPIC SINK_TOPIC OUT_DIR

Against a cluster of broker sets (``ETCD``): a batch read of TOPIC, a streaming read of it
(availableNow, into parquet under OUT_DIR, then read back), and the sink writing 100 rows into
SINK_TOPIC. Prints one JSON line: what each job saw.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.spark.session import build_session, stop_session


def main() -> None:
    master, etcd, topic, sink_topic, out = sys.argv[1:6]
    spark = build_session(master=master, app_name="rmq-cluster-test", driver_memory="1g",
                          conf={"spark.executor.memory": "512m", "spark.sql.shuffle.partitions": "2",
                                "spark.driver.host": "127.0.0.1"})
    try:
        batch = spark.read.format("rmq").option("cluster", etcd).option("topics", topic).load()
        rows = batch.selectExpr("topic", "CAST(body AS STRING) AS text", "store_host").collect()
        query = (spark.readStream.format("rmq").option("cluster", etcd).option("topics", topic)
                 .option("startingOffsets", "earliest").load()
                 .selectExpr("CAST(body AS STRING) AS text")
                 .writeStream.format("parquet").option("path", f"{out}/stream")
                 .option("checkpointLocation", f"{out}/checkpoint").trigger(availableNow=True).start())
        query.awaitTermination()
        streamed = [r.text for r in spark.read.parquet(f"{out}/stream").collect()]
        offsets = json.loads(query.lastProgress["sources"][0]["endOffset"])
        (spark.range(100).selectExpr("CONCAT('sunk-', CAST(id AS STRING)) AS body").repartition(4)
         .write.format("rmq").option("cluster", etcd).option("topic", sink_topic).mode("append").save())
        print(json.dumps({"batch": [r.text for r in rows], "topics": sorted({r.topic for r in rows}),
                          "hosts": sorted({r.store_host for r in rows}), "streamed": streamed,
                          "offset_keys": sorted(offsets)}))
    finally:
        stop_session(spark)


if __name__ == "__main__":
    main()
