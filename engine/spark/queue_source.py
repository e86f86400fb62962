"""``rmq``: queue-level batch and streaming reads with Kafka-like offsets, and the sink.

    spark.read.format("rmq").option("path", "store").option("topics", "orders").load()
    spark.readStream.format("rmq").option("endpoint", "tcp://host:10911").option("topics", "orders").load()
    spark.read.format("rmq").option("cluster", "http://etcd:2379").option("topics", "orders").load()
    df.write.format("rmq").option("endpoint", "tcp://host:10911").mode("append").save()

Reads go through the ConsumeQueues, so they return exactly what a consumer
pulling the same offsets gets, in queue order. Each Spark partition is one
range of one queue (``maxRecordsPerPartition`` messages at most). Over a
cluster of broker sets (``cluster``: etcd's endpoints) each range is read at
the set that holds it, and a topic's queues on set B are those of
``topic@B`` in offsets (``engine/spark/transport.py``, ``ClusterTransport``).

Streaming offsets are the next queue offset per queue (``queue_offsets``).
Spark writes the end offsets of each micro-batch to its checkpoint before
the batch runs, and a batch reads exactly [start, end) of every queue, so a
query restarted from its checkpoint neither skips nor repeats a message.
``commit`` does nothing: the checkpoint is the truth.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    Filter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from engine.spark import queue_offsets
from engine.spark.arrow_rows import MESSAGE_SCHEMA
from engine.spark.options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    OptionError,
    check_known,
    get_bool,
    get_int,
    get_offsets,
    get_str,
    get_topics,
)
from engine.spark.queue_offsets import Bounds, Offsets, OffsetsJson
from engine.spark.record_filter import RecordFilter
from engine.spark.sink import WRITE_OPTIONS, QueueStreamWriter, QueueWriter
from engine.spark.transport import CLUSTER_SEPARATOR, ClusterTransport, EndpointTransport, FileTransport, QueueRange

SOURCE_NAME = "rmq"
TRANSPORT_OPTIONS = frozenset({"path", "endpoint", "cluster", "clustername", "readfromreplicas", "timeoutms"})
READ_OPTIONS = TRANSPORT_OPTIONS | {"topics", "startingoffsets", "startingtimestamp", "failondataloss",
                                    "includebody", "maxrecordsperpartition", "pullbatchsize"}
Transport = FileTransport | EndpointTransport | ClusterTransport


@dataclass(frozen=True)
class ReadSettings:
    topics: tuple[str, ...]
    starting: OffsetSpec
    starting_timestamp_ms: int | None
    fail_on_data_loss: bool
    include_body: bool
    records_per_partition: int


class QueuePartition(InputPartition):
    """One range of one queue, with the transport that reads it (picklable: names and numbers)."""

    def __init__(self, task: QueueRange, transport: Transport, include_body: bool) -> None:
        super().__init__(f"{task.topic}/{task.queue_id}@{task.start}")
        self.task = task
        self.transport = transport
        self.include_body = include_body


def make_transport(options: Mapping[str, str], *, fail_on_data_loss: bool) -> Transport:
    path, endpoint, cluster = get_str(options, "path"), get_str(options, "endpoint"), get_str(options, "cluster")
    if sum(option is not None for option in (path, endpoint, cluster)) != 1:
        raise OptionError(f"{SOURCE_NAME} needs exactly one of the options 'path' (a store directory, read as "
                          f"files), 'endpoint' (a live engine, e.g. tcp://127.0.0.1:10911) and 'cluster' (the etcd "
                          f"of a cluster of broker sets, e.g. http://127.0.0.1:2379)")
    if path is not None:
        return FileTransport(path, fail_on_data_loss=fail_on_data_loss)
    timeout_ms = get_int(options, "timeoutMs", default=10_000, minimum=1) or 10_000
    pull_batch = get_int(options, "pullBatchSize", default=256, minimum=1) or 256
    if cluster is not None:
        return ClusterTransport(tuple(cluster.split(",")), get_str(options, "clusterName") or "DefaultCluster",
                                fail_on_data_loss=fail_on_data_loss, timeout_ms=timeout_ms, pull_batch=pull_batch,
                                from_replicas=get_bool(options, "readFromReplicas", default=False))
    assert endpoint is not None
    return EndpointTransport(endpoint, fail_on_data_loss=fail_on_data_loss, timeout_ms=timeout_ms,
                             pull_batch=pull_batch)


def topic_keys(transport: Transport, topics: tuple[str, ...]) -> dict[str, list[str]]:
    """Each topic's keys in offsets: itself, or over a cluster one ``topic@set`` per set serving it."""
    if isinstance(transport, ClusterTransport):
        return transport.expand(topics)
    counts = transport.queue_counts()
    return {topic: [topic] if topic in counts else [] for topic in topics}


def read_settings(options: Mapping[str, str], *, streaming: bool) -> ReadSettings:
    topics = get_topics(options, required=True)
    starting = get_offsets(options, "startingOffsets", topics=topics, default=LATEST if streaming else EARLIEST)
    if not streaming and starting == LATEST:
        raise OptionError("startingOffsets=latest reads nothing in a batch query; use earliest or JSON offsets")
    return ReadSettings(topics, starting,
                        get_int(options, "startingTimestamp", default=None, minimum=0),
                        get_bool(options, "failOnDataLoss", default=True),
                        get_bool(options, "includeBody", default=True),
                        get_int(options, "maxRecordsPerPartition", default=50_000, minimum=1) or 50_000)


class QueueDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return MESSAGE_SCHEMA

    def reader(self, schema: StructType) -> QueueBatchReader:
        check_known(self.options, READ_OPTIONS | {"endingoffsets"}, f"{SOURCE_NAME} (batch read)")
        return QueueBatchReader(self.options)

    def streamReader(self, schema: StructType) -> QueueStreamReader:
        check_known(self.options, READ_OPTIONS | {"maxoffsetspertrigger"}, f"{SOURCE_NAME} (readStream)")
        return QueueStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        check_known(self.options, TRANSPORT_OPTIONS | WRITE_OPTIONS, f"{SOURCE_NAME} (write)")
        return QueueWriter(self.options, schema, overwrite=overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        check_known(self.options, TRANSPORT_OPTIONS | WRITE_OPTIONS, f"{SOURCE_NAME} (writeStream)")
        return QueueStreamWriter(self.options, schema, overwrite=overwrite)


def current_bounds(transport: Transport, topics: tuple[str, ...], *, require_topics: bool) -> Bounds:
    """(min, max) of every queue of ``topics`` now."""
    transport.refresh()
    keys = topic_keys(transport, topics)
    counts = transport.queue_counts()
    missing = [t for t in topics if not keys[t]]
    if missing and require_topics:
        raise OptionError(f"topic(s) {', '.join(missing)} do not exist in {transport.describe()}")
    return {(key, q): transport.bounds(key, q) for topic in topics for key in keys[topic]
            for q in range(counts.get(key, 0))}


def start_offsets(settings: ReadSettings, transport: Transport, bounds: Bounds) -> Offsets:
    if settings.starting_timestamp_ms is not None:
        return queue_offsets.resolve_by_time(bounds, settings.starting_timestamp_ms, transport.offset_for_time)
    return queue_offsets.resolve(settings.starting, bounds, default=EARLIEST)


def split(start: Offsets, end: Offsets, transport: Transport, settings: ReadSettings) -> list[QueuePartition]:
    """One partition per queue range of at most ``records_per_partition`` messages."""
    step = settings.records_per_partition
    parts = []
    for (topic, queue_id), stop in sorted(end.items()):
        for first in range(start.get((topic, queue_id), 0), stop, step):
            task = QueueRange(topic, queue_id, first, min(stop, first + step))
            parts.append(QueuePartition(task, transport, settings.include_body))
    return parts


def read_partition(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    assert isinstance(partition, QueuePartition)
    yield from partition.transport.read(partition.task, include_body=partition.include_body)


class QueueBatchReader(DataSourceReader):
    """Pushed-down filters narrow the plan: ``topic`` and ``queue_id`` select queues, and
    ``store_timestamp`` bounds become offsets (store times only grow along a queue)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.settings = read_settings(options, streaming=False)
        self.wanted = RecordFilter()
        self.ending = get_offsets(options, "endingOffsets", topics=self.settings.topics, default=LATEST)
        if self.ending == EARLIEST:
            raise OptionError("endingOffsets=earliest reads nothing; use latest or JSON offsets")
        self.transport = make_transport(options, fail_on_data_loss=self.settings.fail_on_data_loss)
        keys = topic_keys(self.transport, self.settings.topics)
        missing = [t for t in self.settings.topics if not keys[t]]
        if missing:  # fail when the DataFrame is defined, not when it is first used
            raise OptionError(f"topic(s) {', '.join(missing)} do not exist in {self.transport.describe()}")

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for pushed in filters:
            self.wanted = self.wanted.with_pushed(pushed) or self.wanted
            yield pushed  # Spark checks every filter again: ours only prune

    def partitions(self) -> Sequence[InputPartition]:
        bounds = current_bounds(self.transport, self.settings.topics, require_topics=True)
        start = start_offsets(self.settings, self.transport, bounds)
        end = queue_offsets.resolve(self.ending, bounds, default=LATEST)
        start = queue_offsets.check_range(start, end, bounds, fail_on_data_loss=self.settings.fail_on_data_loss)
        start, end = narrow(self.wanted, self.transport, start, end)
        return split(start, end, self.transport, self.settings)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)


def narrow(wanted: RecordFilter, transport: Transport, start: Offsets, end: Offsets) -> tuple[Offsets, Offsets]:
    """The ranges that can hold messages ``wanted`` matches: other queues dropped, times made offsets."""
    kept = {key for key in end if (wanted.topics is None or key[0].partition(CLUSTER_SEPARATOR)[0] in wanted.topics)
            and (wanted.queue_ids is None or key[1] in wanted.queue_ids) and not wanted.empty}
    start = {key: offset for key, offset in start.items() if key in kept}
    end = {key: offset for key, offset in end.items() if key in kept}
    for key in kept:
        if start[key] < end[key] and wanted.start_ms is not None:
            start[key] = min(max(start[key], transport.offset_for_time(*key, wanted.start_ms)), end[key])
        if start[key] < end[key] and wanted.end_ms is not None:
            end[key] = max(min(end[key], transport.offset_for_time(*key, wanted.end_ms)), start[key])
    return start, end


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.settings = read_settings(options, streaming=True)
        self.max_per_trigger = get_int(options, "maxOffsetsPerTrigger", default=None, minimum=1)
        self.transport = make_transport(options, fail_on_data_loss=self.settings.fail_on_data_loss)
        self.available_now_target: Offsets | None = None

    def initialOffset(self) -> OffsetsJson:
        bounds = current_bounds(self.transport, self.settings.topics, require_topics=False)
        return queue_offsets.to_json(start_offsets(self.settings, self.transport, bounds))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_per_trigger is None else ReadMaxRows(self.max_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        """availableNow: read up to what exists now, and not beyond, however long it takes."""
        bounds = current_bounds(self.transport, self.settings.topics, require_topics=False)
        self.available_now_target = {key: high for key, (_low, high) in bounds.items()}

    def latestOffset(self, start: OffsetsJson, limit: ReadLimit) -> OffsetsJson:
        begin = queue_offsets.from_json(start)
        if self.available_now_target is not None:
            latest = dict(self.available_now_target)
        else:
            bounds = current_bounds(self.transport, self.settings.topics, require_topics=False)
            latest = {key: high for key, (_low, high) in bounds.items()}
        for key, offset in begin.items():  # never move back (nor forget a queue)
            latest[key] = max(latest.get(key, offset), offset)
        if isinstance(limit, ReadMaxRows):
            latest = queue_offsets.rate_limit(begin, latest, limit.max_rows)
        return queue_offsets.to_json(latest)

    def partitions(self, start: OffsetsJson, end: OffsetsJson) -> Sequence[InputPartition]:
        self.transport.refresh()  # the file transport ships a fresh snapshot with each batch
        return split(queue_offsets.from_json(start), queue_offsets.from_json(end), self.transport, self.settings)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)

    def commit(self, end: OffsetsJson) -> None:
        """Nothing to do: Spark's checkpoint, not the engine, records how far the query read."""

    def stop(self) -> None:
        if isinstance(self.transport, EndpointTransport | ClusterTransport):
            self.transport.close()
