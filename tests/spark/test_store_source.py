"""``rmq_store``: the CommitLog scan against what the engine itself serves, pruning, bounds, damage."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from engine.layout import HostAddress, RecordFields, encode_properties, encode_record, offset_to_file_name
from engine.store.checkpoint import load_checkpoint
from engine.store.commit_log import COMMIT_LOG_DIR
from engine.store.mapped_file import list_files
from supervisor.launcher import EngineProcess
from tests.helpers import wait_dispatched
from tests.spark.conftest import SPARK_CONFIG, Store, copy_store
from tests.spark.dataset import DATASET_TOPICS, Sent, pull_topics, rows_by_position, send_batches

pytestmark = pytest.mark.timeout(180)


def read_store(spark, path: Path, **options: str):  # spark: a SparkSession; returns a DataFrame
    reader = spark.read.format("rmq_store")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(str(path))


def test_a_scan_of_a_live_store_equals_what_the_engine_serves_field_for_field(spark, live: Store) -> None:
    rows = read_store(spark, live.path, topics=",".join(DATASET_TOPICS)).collect()
    scanned = rows_by_position(rows)
    with live.engine.client() as client:
        pulled = pull_topics(client, DATASET_TOPICS)
        assert scanned == pulled
        assert len(scanned) == len(live.sent.results)
        rng = random.Random(3)
        for n in rng.sample(range(1200), 25):  # lookups by key and by id: the same messages
            key = f"orders-{n}"
            found = client.query_by_key("orders", key)
            assert found == [m for m in scanned.values() if key in m["keys"]]
            assert [client.get_by_id(m["msg_id"]) for m in found] == found


def test_a_scan_without_bodies_keeps_every_other_field(spark, live: Store) -> None:
    with_bodies = rows_by_position(read_store(spark, live.path, topics="burst").collect())
    without = rows_by_position(read_store(spark, live.path, topics="burst", includeBody="false",
                                          verifyCrc="false").collect())
    assert all(m["body"] is None for m in without.values())
    assert {k: {**m, "body": None} for k, m in with_bodies.items()} == without


def test_filters_on_topic_queue_and_time_prune_segments_and_keep_every_match(spark, stopped: Store) -> None:
    everything = read_store(spark, stopped.path)
    segments = len(list_files(stopped.path / COMMIT_LOG_DIR))
    assert everything.rdd.getNumPartitions() == segments >= 6
    all_rows = rows_by_position(everything.collect())
    burst_segments = {m["commit_log_offset"] // stopped.config.segment_size_bytes
                      for m in all_rows.values() if m["topic"] == "burst"}

    by_topic = everything.filter(F.col("topic") == "burst")
    assert by_topic.rdd.getNumPartitions() == len(burst_segments) < segments
    assert rows_by_position(by_topic.collect()) == {k: m for k, m in all_rows.items() if k[0] == "burst"}

    by_queue = everything.filter((F.col("topic") == "burst") & F.col("queue_id").isin(1))
    assert rows_by_position(by_queue.collect()) == {k: m for k, m in all_rows.items() if k[:2] == ("burst", 1)}

    first, last = stopped.sent.burst_first_ms, stopped.sent.burst_last_ms
    window = everything.filter((F.col("store_timestamp") >= F.timestamp_millis(F.lit(first)))
                               & (F.col("store_timestamp") <= F.timestamp_millis(F.lit(last))))
    assert window.rdd.getNumPartitions() < segments
    assert rows_by_position(window.collect()) == {k: m for k, m in all_rows.items()
                                                  if first <= m["store_timestamp"] <= last}

    by_option = read_store(spark, stopped.path, topics="burst", startTimestamp=str(first), endTimestamp=str(last))
    assert by_option.rdd.getNumPartitions() <= len(burst_segments)
    assert rows_by_position(by_option.collect()) == {k: m for k, m in all_rows.items()
                                                     if k[0] == "burst" and m["store_timestamp"] < last}


def test_a_live_store_is_read_up_to_the_confirmed_offset_and_not_a_byte_further(spark, tmp_path: Path) -> None:
    """A record past the writer's confirmed offset (a batch being written) is never read, even a whole one."""
    engine = EngineProcess(tmp_path / "store", config=SPARK_CONFIG)
    engine.start()
    try:
        with engine.client() as client:
            client.create_topic("confirmed", queue_count=2)
            send_batches(client, random.Random(9), "confirmed", 100, Sent(), queue_count=2)
            wait_dispatched(client)
            pulled = pull_topics(client, {"confirmed": 2})
            confirmed = client.status()["offsets"]["confirmed_offset"]
        plant_record_at(engine.store_dir, confirmed, topic="confirmed", queue_offset=len(pulled))
        assert rows_by_position(read_store(spark, engine.store_dir).collect()) == pulled
        queues = spark.read.format("rmq").option("path", str(engine.store_dir)).option("topics", "confirmed")
        assert rows_by_position(queues.load().collect()) == pulled
    finally:
        engine.stop()


def plant_record_at(store: Path, offset: int, *, topic: str, queue_offset: int) -> None:
    """Write a complete, valid record at ``offset`` of the log, as the writer would (but unannounced)."""
    segment = SPARK_CONFIG.segment_size_bytes
    fields = RecordFields(topic.encode(), 0, b"never confirmed", encode_properties({"UNIQ_KEY": "PLANTED"}), 0,
                          1, HostAddress.parse("127.0.0.1", 1))
    record = encode_record(fields, queue_offset=queue_offset, commit_log_offset=offset, store_timestamp_ms=2,
                           store_host=HostAddress.parse("127.0.0.1", 1))
    assert offset % segment + len(record) < segment
    fd = os.open(store / COMMIT_LOG_DIR / offset_to_file_name(offset - offset % segment), os.O_WRONLY)
    try:
        os.pwrite(fd, record, offset % segment)
    finally:
        os.close(fd)


def test_a_crashed_store_is_read_up_to_its_flushed_offset_and_a_damaged_one_fails(spark, stopped: Store,
                                                                                   tmp_path: Path) -> None:
    store = copy_store(stopped, tmp_path / "crashed")
    expected = read_store(spark, store).count()
    flushed = load_checkpoint(store).flushed_offset
    # the segment that holds the end (the writer keeps the next one ready, empty, after it)
    last_start, last_path = [(start, path) for start, path in list_files(store / COMMIT_LOG_DIR)
                             if start <= flushed][-1]
    with open(last_path, "r+b") as f:  # a torn batch after the end: bytes that are no record
        f.seek(flushed - last_start)
        f.write(b"\xde\xad" * 300)

    with pytest.raises(Exception, match="hold no valid record"):
        read_store(spark, store).count()  # a stopped store: every byte counts, so this is damage
    assert read_store(spark, store, onDamage="skip").count() == expected

    (store / "abort").write_text("1")  # the engine did not stop: only what was flushed is read
    assert read_store(spark, store).count() == expected


def test_a_store_written_without_our_extensions_reads_like_a_broker_copy(spark, tmp_path: Path) -> None:
    """No record CRC property, RocketMQ's 40-byte checkpoint, no topic table: a broker's files."""
    config = SPARK_CONFIG.replace(record_crc_enabled=False)
    engine = EngineProcess(tmp_path / "broker", config=config)
    engine.start()
    try:
        with engine.client() as client:
            client.create_topic("copied", queue_count=3)
            send_batches(client, random.Random(5), "copied", 400, Sent(), queue_count=3)
            wait_dispatched(client)
            pulled = pull_topics(client, {"copied": 3})
    finally:
        assert engine.stop() == 0
    store = engine.store_dir
    checkpoint = (store / "checkpoint").read_bytes()
    (store / "checkpoint").write_bytes(checkpoint[:40] + bytes(len(checkpoint) - 40))
    (store / "config" / "topics.json").unlink()
    assert rows_by_position(read_store(spark, store).collect()) == pulled
    queues = spark.read.format("rmq").option("path", str(store)).option("topics", "copied").load()
    assert rows_by_position(queues.collect()) == pulled


def test_bad_options_are_refused_with_the_option_named(spark, stopped: Store, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="does not know the option"):
        read_store(spark, stopped.path, topic="orders").count()
    with pytest.raises(Exception, match="'includeBody' must be true or false"):
        read_store(spark, stopped.path, includeBody="yes").count()
    with pytest.raises(Exception, match="is not a store directory"):
        read_store(spark, tmp_path).count()
    with pytest.raises(Exception, match="needs the store directory"):
        spark.read.format("rmq_store").load().count()
