"""PySpark connector: the store's messages as DataFrames, and DataFrames into the store.

Everything here needs the ``spark`` extra (``pip install -e '.[spark]'``:
pyspark and pyarrow); the engine itself never imports this package.

    from engine.spark import register

    register(spark)  # once per SparkSession
    df = spark.read.format("rmq_store").option("topics", "orders").load("store")

Sources (Python Data Sources, see docs/spark.md):

* ``rmq_store``: batch scan of a store directory's CommitLog, one partition per segment;
* ``rmq``: queue-level ``read`` / ``readStream`` with Kafka-like offsets, over files
  (``path``) or a live engine (``endpoint``), and ``write`` / ``writeStream`` into a
  live engine (at-least-once).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.spark.queue_source import QueueDataSource
from engine.spark.store_source import StoreDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["QueueDataSource", "StoreDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Make ``rmq_store`` and ``rmq`` known to ``spark`` (registration is per session)."""
    spark.dataSource.register(StoreDataSource)
    spark.dataSource.register(QueueDataSource)
