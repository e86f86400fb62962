"""The ``rmq`` sink: DataFrames written into a live engine come back from it, field by field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from tests.helpers import wait_dispatched
from tests.spark.conftest import Store
from tests.spark.dataset import pull_all

pytestmark = pytest.mark.timeout(180)

SINK_SCHEMA = StructType([
    StructField("topic", StringType()), StructField("body", BinaryType()),
    StructField("keys", ArrayType(StringType())), StructField("tags", StringType()),
    StructField("properties", MapType(StringType(), StringType())), StructField("queue_id", IntegerType())])


def test_written_rows_can_be_pulled_back_with_their_keys_tags_properties_and_queue(spark, live: Store) -> None:
    with live.engine.client() as client:
        client.create_topic("sink-a", queue_count=3)
        client.create_topic("sink-b", queue_count=2)
    rows = [("sink-a" if n % 4 else "sink-b", b"body-%d-" % n + bytes(n % 300), [f"k{n}", f"g{n % 5}"],
             None if n % 3 == 0 else f"tag{n % 2}", {"n": str(n), "ü": "✓"}, n % 2)
            for n in range(500)]
    df = spark.createDataFrame(rows, SINK_SCHEMA).repartition(3)
    df.write.format("rmq").option("endpoint", live.endpoint).option("batchSize", "40").mode("append").save()

    with live.engine.client() as client:
        wait_dispatched(client)
        stored = [m for topic, queues in (("sink-a", 3), ("sink-b", 2)) for q in range(queues)
                  for m in pull_all(client, topic, q)]
        found = client.query_by_key("sink-a", "k7")
    assert len(stored) == 500  # this run did not retry a task: exactly once here
    got = sorted((m["topic"], m["body"], m["keys"], m["tags"], {k: v for k, v in m["properties"].items()
                                                                 if k != "UNIQ_KEY"}, m["queue_id"])
                 for m in stored)
    assert got == sorted((t, b, k, g, p, q) for t, b, k, g, p, q in rows)
    assert [m["body"] for m in found] == [rows[7][1]]


def test_a_topic_option_and_string_bodies_and_keys_are_accepted(spark, live: Store) -> None:
    with live.engine.client() as client:
        client.create_topic("sink-c", queue_count=1)
    df = spark.createDataFrame([("hello ✓", "key-1"), ("world", "key-2")], "body string, keys string")
    df.write.format("rmq").option("endpoint", live.endpoint).option("topic", "sink-c").mode("append").save()
    with live.engine.client() as client:
        stored = pull_all(client, "sink-c", 0)
    assert sorted((m["body"], m["keys"]) for m in stored) == [("hello ✓".encode(), ["key-1"]), (b"world", ["key-2"])]


def test_a_stream_from_one_topic_into_another_carries_every_message_once(spark, live: Store, tmp_path: Path) -> None:
    with live.engine.client() as client:
        client.create_topic("pipe-in", queue_count=2)
        client.create_topic("pipe-out", queue_count=2)
        for n in range(6):
            client.send("pipe-in", [{"body": b"%d-%d" % (n, i), "keys": [f"p{n}-{i}"]} for i in range(10)],
                        queue_id=n % 2)
        wait_dispatched(client)
    source = (spark.readStream.format("rmq").option("endpoint", live.endpoint).option("topics", "pipe-in")
              .option("startingOffsets", "earliest").load())
    query = (source.selectExpr("'pipe-out' AS topic", "body", "keys", "queue_id").writeStream.format("rmq")
             .option("endpoint", live.endpoint).option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    with live.engine.client() as client:
        wait_dispatched(client)
        moved = [m for q in range(2) for m in pull_all(client, "pipe-out", q)]
    assert sorted((m["queue_id"], m["body"]) for m in moved) == \
        sorted((n % 2, b"%d-%d" % (n, i)) for n in range(6) for i in range(10))


def test_bad_sink_input_is_refused_before_anything_is_sent(spark, live: Store) -> None:
    with pytest.raises(Exception, match="does not know column 'tag'"):
        spark.createDataFrame([("t", b"x", "a")], "topic string, body binary, tag string") \
            .write.format("rmq").option("endpoint", live.endpoint).mode("append").save()
    with pytest.raises(Exception, match="set option 'endpoint'"):
        spark.createDataFrame([("t", b"x")], "topic string, body binary") \
            .write.format("rmq").option("path", str(live.path)).mode("append").save()
    with pytest.raises(Exception, match="cannot overwrite"):
        spark.createDataFrame([("t", b"x")], "topic string, body binary") \
            .write.format("rmq").option("endpoint", live.endpoint).mode("overwrite").save()
    with pytest.raises(Exception, match="needs a 'topic' column or option 'topic'"):
        spark.createDataFrame([(b"x",)], "body binary").write.format("rmq") \
            .option("endpoint", live.endpoint).mode("append").save()
    with pytest.raises(Exception, match="reserved"):  # the engine's own refusal comes back as it is
        spark.createDataFrame([("sink-c", b"x", {"KEYS": "k"})], "topic string, body binary, "
                                                                 "properties map<string,string>") \
            .write.format("rmq").option("endpoint", live.endpoint).mode("append").save()
