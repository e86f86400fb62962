"""``rmq``: queue reads over files and over a live engine, offsets, streaming resume, data loss."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from engine.store.commit_log import COMMIT_LOG_DIR
from engine.store.mapped_file import list_files
from tests.helpers import wait_dispatched
from tests.spark.conftest import Store, copy_store
from tests.spark.dataset import DATASET_TOPICS, Sent, pull_all, pull_topics, rows_by_position, send_batches

pytestmark = pytest.mark.timeout(180)


def queue_reader(spark, **options: str):  # spark: a SparkSession; returns a DataFrameReader
    reader = spark.read.format("rmq")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader


def transports(store: Store) -> dict[str, dict[str, str]]:
    return {"path": {"path": str(store.path)}, "endpoint": {"endpoint": store.endpoint}}


def test_a_queue_read_over_files_or_the_endpoint_equals_what_the_engine_serves(spark, live: Store) -> None:
    with live.engine.client() as client:
        pulled = pull_topics(client, DATASET_TOPICS)
    for name, transport in transports(live).items():
        df = queue_reader(spark, topics="orders,burst", maxRecordsPerPartition="100", **transport).load()
        assert df.rdd.getNumPartitions() > len(pulled) // 100, name  # queues split into ranges
        rows = df.collect()
        assert rows_by_position(rows) == pulled, name
        per_queue = [(r["topic"], r["queue_id"], r["queue_offset"]) for r in rows]
        assert per_queue == sorted(per_queue), f"{name}: not in queue order"


def test_starting_and_ending_offsets_and_a_starting_timestamp_select_ranges(spark, live: Store) -> None:
    with live.engine.client() as client:
        pulled = pull_topics(client, DATASET_TOPICS)
    starting = json.dumps({"orders": {"0": 10, "2": -1}, "burst": {"1": -2}})
    ending = json.dumps({"orders": {"0": 20, "1": 5}})
    for name, transport in transports(live).items():
        df = queue_reader(spark, topics="orders,burst", startingOffsets=starting, endingOffsets=ending,
                          **transport).load()
        got = set(rows_by_position(df.collect()))
        wanted_orders = {0: range(10, 20), 1: range(5), 2: range(0), 3: range(10**6)}
        expected = {k for k in pulled if k[0] == "burst" or k[2] in wanted_orders[k[1]]}
        assert got == expected, name
        since = live.sent.burst_first_ms
        by_time = queue_reader(spark, topics="burst,orders", startingTimestamp=str(since), **transport).load()
        assert set(rows_by_position(by_time.collect())) == {k for k, m in pulled.items()
                                                             if m["store_timestamp"] >= since}, name


def test_filters_on_topic_queue_and_time_narrow_the_queue_ranges_read(spark, live: Store) -> None:
    with live.engine.client() as client:
        pulled = pull_topics(client, DATASET_TOPICS)
    first, last = live.sent.burst_first_ms, live.sent.burst_last_ms
    for name, transport in transports(live).items():
        df = queue_reader(spark, topics="orders,burst", maxRecordsPerPartition="50", **transport).load()
        everything = df.rdd.getNumPartitions()
        by_queue = df.filter((F.col("topic") == "orders") & F.col("queue_id").isin(1, 2))
        assert by_queue.rdd.getNumPartitions() < everything / 2, name
        assert rows_by_position(by_queue.collect()) == {k: m for k, m in pulled.items()
                                                        if k[0] == "orders" and k[1] in (1, 2)}, name
        window = df.filter((F.col("store_timestamp") >= F.timestamp_millis(F.lit(first)))
                           & (F.col("store_timestamp") < F.timestamp_millis(F.lit(last))))
        assert window.rdd.getNumPartitions() < everything / 2, name
        assert rows_by_position(window.collect()) == {k: m for k, m in pulled.items()
                                                      if first <= m["store_timestamp"] < last}, name


def test_bad_queue_options_are_refused_with_the_reason(spark, live: Store) -> None:
    cases = [({"topics": "orders"}, "exactly one of the options 'path'"),
             ({"path": str(live.path), "endpoint": live.endpoint, "topics": "orders"}, "exactly one of"),
             ({"path": str(live.path)}, "option 'topics' is required"),
             ({"path": str(live.path), "topics": "nope"}, "do not exist"),
             ({"path": str(live.path), "topics": "orders", "startingOffsets": "latest"}, "reads nothing"),
             ({"path": str(live.path), "topics": "orders", "startingOffsets": '{"burst": {"0": 1}}'},
              "not in option 'topics'"),
             ({"path": str(live.path), "topics": "orders", "endingOffsets": '{"orders": {"0": 99999}}'},
              "is past its end"),
             ({"endpoint": live.endpoint, "topics": "orders", "maxOffsetsPerTrigger": "5"}, "does not know")]
    for options, message in cases:
        with pytest.raises(Exception, match=message):
            queue_reader(spark, **options).load().collect()


@pytest.mark.slow
def test_a_stream_over_the_endpoint_picks_up_new_messages_and_resumes_without_loss_or_repeat(
        spark, live: Store, tmp_path: Path) -> None:
    rng = random.Random(21)
    sent = Sent()
    with live.engine.client() as client:
        client.create_topic("stream-e", queue_count=3)

        def send(count: int, first: int) -> None:
            send_batches(client, rng, "stream-e", count, sent, queue_count=3, first=first)
            wait_dispatched(client)  # the queues have the units: the next trigger sees them

        def start():  # returns a StreamingQuery
            stream = (spark.readStream.format("rmq").option("endpoint", live.endpoint).option("topics", "stream-e")
                      .option("startingOffsets", "earliest").load())
            return (stream.writeStream.format("parquet").option("path", str(tmp_path / "out"))
                    .option("checkpointLocation", str(tmp_path / "checkpoint"))
                    .trigger(processingTime="100 milliseconds").start())

        send(60, 0)
        query = start()
        try:
            query.processAllAvailable()
            assert output_positions(spark, tmp_path) == sent_positions(sent)
            send(45, 60)  # while it runs
            query.processAllAvailable()
            assert output_positions(spark, tmp_path) == sent_positions(sent)
        finally:
            query.stop()
        send(30, 105)  # while it is stopped
        query = start()
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        pulled = {(m["topic"], m["queue_id"], m["queue_offset"]): m for q in range(3)
                  for m in pull_all(client, "stream-e", q)}
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert len(rows) == 135
    assert {k: m["body"] for k, m in rows_by_position(rows).items()} == {k: m["body"] for k, m in pulled.items()}


def output_positions(spark, tmp_path: Path) -> list[tuple[str, int, int]]:  # spark: a SparkSession
    rows = spark.read.parquet(str(tmp_path / "out")).select("topic", "queue_id", "queue_offset").collect()
    return sorted((r[0], r[1], r[2]) for r in rows)


def sent_positions(sent: Sent) -> list[tuple[str, int, int]]:
    return sorted((r["topic"], r["queue_id"], r["queue_offset"]) for r in sent.results)


@pytest.mark.slow
def test_available_now_over_files_honours_max_offsets_per_trigger_and_reads_only_new_messages_after(
        spark, live: Store, tmp_path: Path) -> None:
    rng = random.Random(22)
    sent = Sent()
    with live.engine.client() as client:
        client.create_topic("stream-f", queue_count=2)
        send_batches(client, rng, "stream-f", 70, sent, queue_count=2)
        wait_dispatched(client)

        def run_available_now() -> list[int]:
            stream = (spark.readStream.format("rmq").option("path", str(live.path)).option("topics", "stream-f")
                      .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "25").load())
            query = (stream.writeStream.format("parquet").option("path", str(tmp_path / "out"))
                     .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
            assert query.awaitTermination(120), "the availableNow run did not finish"
            return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

        assert run_available_now() == [25, 25, 20]
        send_batches(client, rng, "stream-f", 40, sent, queue_count=2, first=70)
        wait_dispatched(client)
        assert run_available_now() == [25, 15]
    assert output_positions(spark, tmp_path) == sent_positions(sent)


def test_offsets_removed_from_the_log_are_data_loss_unless_allowed(spark, stopped: Store, tmp_path: Path) -> None:
    store = copy_store(stopped, tmp_path / "store")
    first_segment = list_files(store / COMMIT_LOG_DIR)[0][1]
    first_segment.unlink()  # what retention does to the oldest segment
    options = {"path": str(store), "topics": "orders", "startingOffsets": json.dumps({"orders": {"0": 0}})}
    with pytest.raises(Exception, match="older messages were removed"):
        queue_reader(spark, **options).load().collect()
    rows = queue_reader(spark, failOnDataLoss="false", **options).load().collect()
    earliest = queue_reader(spark, path=str(store), topics="orders").load().collect()
    assert rows_by_position(rows) == rows_by_position(earliest)
    assert 0 < len(earliest) < stopped.sent.count("orders")
    assert min(r["commit_log_offset"] for r in earliest) >= stopped.config.segment_size_bytes
