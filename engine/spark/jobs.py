"""Export and statistics jobs over a store directory, for ``scripts/spark_export.py`` and ``spark_stats.py``.

Both read the CommitLog with the ``rmq_store`` source, so they work on a
live engine's directory, a stopped one, or a copy from a RocketMQ broker.
Statistics never move bodies (``includeBody=false``); sizes come from each
record's stored size.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from engine.progress import SparkJobBar


def read_store(spark: SparkSession, store_dir: str, *, topics: list[str] | None = None, include_body: bool = True,
               start_ms: int | None = None, end_ms: int | None = None) -> DataFrame:
    reader = spark.read.format("rmq_store").option("includeBody", str(include_body).lower())
    if topics:
        reader = reader.option("topics", ",".join(topics))
    if start_ms is not None:
        reader = reader.option("startTimestamp", str(start_ms))
    if end_ms is not None:
        reader = reader.option("endTimestamp", str(end_ms))
    return reader.load(store_dir)


def export_parquet(spark: SparkSession, store_dir: str, output_dir: str, *, topics: list[str] | None = None,
                   include_body: bool = True, start_ms: int | None = None, end_ms: int | None = None,
                   by_date: bool = False, progress: bool | None = None) -> int:
    """Write the messages as Parquet partitioned by topic (and store date); returns the rows written.

    ``progress``: a bar of the jobs' tasks on stderr (None: when stderr is a terminal)."""
    messages = read_store(spark, store_dir, topics=topics, include_body=include_body, start_ms=start_ms,
                          end_ms=end_ms)
    columns = ["topic"]
    if by_date:
        messages = messages.withColumn("store_date", F.to_date("store_timestamp"))
        columns.append("store_date")
    with SparkJobBar(spark.sparkContext, desc="export", enabled=progress):
        messages.write.partitionBy(*columns).mode("errorifexists").parquet(output_dir)
        return spark.read.parquet(output_dir).count()


def queue_statistics(spark: SparkSession, store_dir: str, *, topics: list[str] | None = None) -> DataFrame:
    """Per (topic, queue_id): messages, offsets, bytes, first and last store time, and missing offsets."""
    messages = read_store(spark, store_dir, topics=topics, include_body=False)
    return (messages.groupBy("topic", "queue_id")
            .agg(F.count("*").alias("messages"),
                 F.min("queue_offset").alias("min_offset"),
                 (F.max("queue_offset") + 1).alias("max_offset"),
                 F.sum("store_size").alias("stored_bytes"),
                 F.min("store_timestamp").alias("first_stored"),
                 F.max("store_timestamp").alias("last_stored"))
            .withColumn("missing_offsets", F.col("max_offset") - F.col("min_offset") - F.col("messages"))
            .orderBy("topic", "queue_id"))


def topic_statistics(queues: DataFrame) -> DataFrame:
    """Per topic, from ``queue_statistics``: queues, messages, bytes, first and last store time."""
    return (queues.groupBy("topic")
            .agg(F.count("*").alias("queues"), F.sum("messages").alias("messages"),
                 F.sum("stored_bytes").alias("stored_bytes"), F.min("first_stored").alias("first_stored"),
                 F.max("last_stored").alias("last_stored"))
            .orderBy("topic"))
