"""The export and statistics jobs against what the engine reports for the same store."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.spark.jobs import export_parquet, queue_statistics, topic_statistics
from tests.spark.conftest import Store
from tests.spark.dataset import DATASET_TOPICS, epoch_ms, pull_topics, rows_by_position

pytestmark = pytest.mark.timeout(180)


@pytest.mark.slow
def test_an_export_to_parquet_holds_every_message_partitioned_by_topic_and_date(spark, live: Store,
                                                                                tmp_path: Path) -> None:
    written = export_parquet(spark, str(live.path), str(tmp_path / "export"), topics=list(DATASET_TOPICS),
                             by_date=True)
    with live.engine.client() as client:
        pulled = pull_topics(client, DATASET_TOPICS)
    assert written == len(pulled)
    assert {p.name for p in (tmp_path / "export").iterdir() if p.is_dir()} == {"topic=orders", "topic=burst"}
    exported = spark.read.parquet(str(tmp_path / "export")).drop("store_date")
    assert rows_by_position(exported.select(*live_columns(spark, live)).collect()) == pulled


def live_columns(spark, live: Store) -> list[str]:  # spark: a SparkSession
    return spark.read.format("rmq_store").load(str(live.path)).columns


def test_queue_and_topic_statistics_match_the_engines_queue_stats(spark, live: Store) -> None:
    queues = queue_statistics(spark, str(live.path), topics=list(DATASET_TOPICS)).collect()
    assert [(r["topic"], r["queue_id"]) for r in queues] == sorted((t, q) for t, n in DATASET_TOPICS.items()
                                                                   for q in range(n))
    with live.engine.client() as client:
        for row in queues:
            stats = client.queue_stats(row["topic"], row["queue_id"])
            assert (row["min_offset"], row["max_offset"], row["messages"], row["missing_offsets"]) == \
                (stats["min_offset"], stats["max_offset"], stats["message_count"], 0)
            assert (epoch_ms(row["first_stored"]), epoch_ms(row["last_stored"])) == \
                (stats["earliest_store_timestamp"], stats["latest_store_timestamp"])
    topics = {r["topic"]: r for r in topic_statistics(spark.createDataFrame(queues)).collect()}
    assert {t: (r["queues"], r["messages"]) for t, r in topics.items()} == \
        {t: (n, live.sent.count(t)) for t, n in DATASET_TOPICS.items()}
    assert topics["orders"]["stored_bytes"] == sum(r["stored_bytes"] for r in queues if r["topic"] == "orders")
