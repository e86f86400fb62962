"""The ``rmq`` sink: rows of a DataFrame become messages of a live engine, at least once.

    df.write.format("rmq").option("endpoint", "tcp://127.0.0.1:10911").mode("append").save()
    df.write.format("rmq").option("cluster", "http://127.0.0.1:2379").mode("append").save()

Columns (any others are refused, so that a misspelt one is not silently dropped):

==========  ============================  =========================================
body        binary or string (required)   a string is sent as its UTF-8 bytes
topic       string                        else option ``topic``
keys        array<string> or string       a string is one key
tags        string
properties  map<string,string>
queue_id    int                           else the engine picks the queue
==========  ============================  =========================================

Over a cluster of broker sets (``cluster``: etcd's endpoints, docs/cluster.md) each batch
goes to the master of one of the sets serving its topic, the sets in turn (the routes are
read from etcd in each task, and again after a refusal); a ``queue_id`` column is refused
there, since each set numbers its own queues.

Each task sends its rows in batches (one ``send`` request per batch, to one
queue, ``batchSize`` messages and about ``batchBytes`` at most) and returns
only when every message was acknowledged ``PUT_OK``. A batch that times out,
or that the engine refuses for a passing reason (BUSY, SERVICE_NOT_AVAILABLE,
SLAVE_NOT_AVAILABLE, FLUSH_FAILED), is sent again (``sendRetries`` times); messages answered
FLUSH_DISK_TIMEOUT or FLUSH_SLAVE_TIMEOUT are sent again too. A failed task is retried by Spark
from its first row. So every row is stored at least once, and a retry can
store a row twice: deduplicate downstream (by a key of your own) if needed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from engine.client import EngineError, RequestTimeout, StoreClient
from engine.spark.options import OptionError, get_int, get_str

WRITE_OPTIONS = frozenset({"topic", "batchsize", "batchbytes", "sendretries"})
_ACCEPTED: dict[str, tuple[type[DataType], ...]] = {
    "body": (BinaryType, StringType),
    "topic": (StringType,),
    "keys": (ArrayType, StringType),
    "tags": (StringType,),
    "properties": (MapType,),
    "queue_id": (IntegerType, LongType, ShortType),
}
_RETRIED_ERRORS = frozenset({"BUSY", "SERVICE_NOT_AVAILABLE", "SLAVE_NOT_AVAILABLE", "FLUSH_FAILED", "TIMEOUT"})
_MESSAGE_OVERHEAD_BYTES = 128  # record header, topic and property separators (an estimate, on the safe side)
SEND_BATCH_BYTES_MAX = 4 << 20  # the engine's default send_batch_bytes_max


class SinkError(RuntimeError):
    """Rows could not be stored; the message says which engine error stopped them."""


@dataclass(frozen=True)
class SinkSettings:
    endpoint: str | None  # a live engine, or None with ``cluster``
    default_topic: str | None
    columns: dict[str, int]  # column name -> position in a row
    batch_size: int
    batch_bytes: int
    retries: int
    timeout_ms: int
    cluster: tuple[str, ...] | None = None  # etcd's endpoints, for a cluster of broker sets
    cluster_name: str = "DefaultCluster"


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task stored."""

    messages: int = 0
    requests: int = 0


def sink_settings(options: Mapping[str, str], schema: StructType, *, overwrite: bool) -> SinkSettings:
    if overwrite:
        raise OptionError("the rmq sink appends messages; it cannot overwrite a store. Use mode('append')")
    endpoint, cluster = get_str(options, "endpoint"), get_str(options, "cluster")
    if (endpoint is None) == (cluster is None):
        raise OptionError("the rmq sink writes into a live engine: set option 'endpoint' (e.g. tcp://127.0.0.1:10911), "
                          "or 'cluster' (the etcd of a cluster of broker sets, e.g. http://127.0.0.1:2379)")
    columns = {}
    for position, column in enumerate(schema.fields):
        accepted = _ACCEPTED.get(column.name)
        if accepted is None:
            raise OptionError(f"the rmq sink does not know column {column.name!r}; it takes "
                              f"{', '.join(_ACCEPTED)} (select only those)")
        if not isinstance(column.dataType, accepted) or not _strings_inside(column.dataType):
            raise OptionError(f"column {column.name!r} is {column.dataType.simpleString()}; the rmq sink takes "
                              f"{' or '.join(t.typeName() for t in accepted)} of strings")
        columns[column.name] = position
    default_topic = get_str(options, "topic")
    if "body" not in columns:
        raise OptionError("the rmq sink needs a 'body' column (binary or string)")
    if "topic" not in columns and default_topic is None:
        raise OptionError("the rmq sink needs a 'topic' column or option 'topic'")
    if cluster is not None and "queue_id" in columns:
        raise OptionError("over a cluster the rmq sink picks the broker set and its queue: drop the 'queue_id' "
                          "column (each set numbers its own queues)")
    batch_bytes = get_int(options, "batchBytes", default=1 << 20, minimum=1) or 1 << 20
    if batch_bytes > SEND_BATCH_BYTES_MAX:
        raise OptionError(f"option 'batchBytes' is at most {SEND_BATCH_BYTES_MAX} (the engine's batch limit)")
    return SinkSettings(endpoint, default_topic, columns,
                        get_int(options, "batchSize", default=256, minimum=1) or 256, batch_bytes,
                        get_int(options, "sendRetries", default=3, minimum=0) or 0,
                        get_int(options, "timeoutMs", default=10_000, minimum=1) or 10_000,
                        tuple(cluster.split(",")) if cluster else None,
                        get_str(options, "clusterName") or "DefaultCluster")


def _strings_inside(data_type: DataType) -> bool:
    if isinstance(data_type, ArrayType):
        return isinstance(data_type.elementType, StringType)
    if isinstance(data_type, MapType):
        return isinstance(data_type.keyType, StringType) and isinstance(data_type.valueType, StringType)
    return True


@dataclass
class _Batch:
    messages: list[dict[str, Any]] = field(default_factory=list)
    bytes: int = 0


class _Targets:
    """Where each batch goes: the one engine, or, over a cluster, the masters of the sets serving the
    batch's topic in turn (each client kept open for the task)."""

    def __init__(self, settings: SinkSettings) -> None:
        self.settings = settings
        self.clients: dict[str, StoreClient] = {}
        self.masters: dict[str, list[str]] = {}  # topic -> the masters of the sets serving it
        self.turn = _task_number()  # tasks start at different sets

    def client(self, topic: str, *, fresh: bool = False) -> StoreClient:
        endpoint = self.settings.endpoint or self._next_master(topic, fresh=fresh)
        client = self.clients.get(endpoint)
        if client is None:
            client = self.clients[endpoint] = StoreClient(endpoint, timeout_ms=self.settings.timeout_ms)
        return client

    def _next_master(self, topic: str, *, fresh: bool) -> str:
        from engine.coordination.etcd import Etcd
        from engine.coordination.routes import topic_route

        assert self.settings.cluster is not None
        if fresh or topic not in self.masters:
            etcd = Etcd(list(self.settings.cluster), timeout_ms=min(self.settings.timeout_ms, 3_000))
            route = topic_route(etcd, self.settings.cluster_name, topic)
            self.masters[topic] = [b.master_endpoint for b in route.brokers if b.master_endpoint]
        masters = self.masters[topic]
        if not masters:
            raise SinkError(f"no broker set of cluster {self.settings.cluster_name!r} with a master serves topic "
                            f"{topic!r}")
        self.turn += 1
        return masters[(self.turn - 1) % len(masters)]

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


def _task_number() -> int:
    """This Spark task's partition id (0 outside a task)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return 0 if context is None else context.partitionId()


def write_rows(settings: SinkSettings, rows: Iterator[Row]) -> SinkCommit:
    """Send every row; return once all are acknowledged (SinkError if the engine refuses them)."""
    done = SinkCommit()
    pending: dict[tuple[str, int | None], _Batch] = {}
    targets = _Targets(settings)
    try:
        for row in rows:
            topic, queue_id, message = _message(settings, row)
            size = _estimate_bytes(message)
            batch = pending.setdefault((topic, queue_id), _Batch())
            if batch.messages and (len(batch.messages) >= settings.batch_size
                                   or batch.bytes + size > settings.batch_bytes):
                _send(targets, settings, topic, queue_id, batch.messages, done)
                batch = pending[(topic, queue_id)] = _Batch()
            batch.messages.append(message)
            batch.bytes += size
        for (topic, queue_id), batch in pending.items():
            if batch.messages:
                _send(targets, settings, topic, queue_id, batch.messages, done)
    finally:
        targets.close()
    return done


def _message(settings: SinkSettings, row: Row) -> tuple[str, int | None, dict[str, Any]]:
    def value(name: str) -> Any:
        position = settings.columns.get(name)
        return None if position is None else row[position]

    topic = value("topic") or settings.default_topic
    body = value("body")
    if topic is None:
        raise SinkError("a row has no topic (its topic column is null and option 'topic' is not set)")
    if body is None:
        raise SinkError(f"a row for topic {topic!r} has a null body")
    keys = value("keys")
    message: dict[str, Any] = {"body": body.encode() if isinstance(body, str) else bytes(body),
                               "keys": [keys] if isinstance(keys, str) else list(keys or ()),
                               "properties": dict(value("properties") or {})}
    tags = value("tags")
    if tags is not None:
        message["tags"] = tags
    return topic, value("queue_id"), message


def _estimate_bytes(message: dict[str, Any]) -> int:
    text = sum(len(k) + 1 for k in message["keys"]) + len(message.get("tags") or "") \
        + sum(len(k) + len(v) + 2 for k, v in message["properties"].items())
    return len(message["body"]) + 4 * text + _MESSAGE_OVERHEAD_BYTES  # 4: UTF-8 at its widest


def _send(targets: _Targets, settings: SinkSettings, topic: str, queue_id: int | None,
          messages: list[dict[str, Any]], done: SinkCommit) -> None:
    """Send one batch until every message is PUT_OK, retrying at most ``retries`` times (over a
    cluster, a retry reads the topic's route again: a set may have a new master)."""
    unacknowledged = messages
    for attempt in range(settings.retries + 1):
        done.requests += 1
        client = targets.client(topic, fresh=attempt > 0)
        try:
            results = client.send(topic, unacknowledged, queue_id=queue_id)
        except RequestTimeout:
            if attempt == settings.retries:
                raise SinkError(f"no answer from {client.endpoint} to a send to {topic!r} after "
                                f"{attempt + 1} attempts") from None
            continue  # unknown outcome: sent again (at least once)
        except EngineError as exc:
            retried = _RETRIED_ERRORS | ({"NOT_MASTER"} if settings.cluster else set())
            if exc.name not in retried or attempt == settings.retries:
                raise SinkError(f"the engine refused a batch for topic {topic!r}: {exc}") from None
            time.sleep(min(1.0, 0.05 * 2 ** attempt))  # backoff: the writer is busy or restarting
            continue
        unacknowledged = [m for m, r in zip(unacknowledged, results, strict=True) if r["status"] != "PUT_OK"]
        done.messages += len(results) - len(unacknowledged)
        if not unacknowledged:
            return
    raise SinkError(f"{len(unacknowledged)} messages for topic {topic!r} were not acknowledged PUT_OK after "
                    f"{settings.retries + 1} attempts")


class QueueWriter(DataSourceWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType, *, overwrite: bool) -> None:
        self.settings = sink_settings(options, schema, overwrite=overwrite)

    def write(self, iterator: Iterator[Row]) -> SinkCommit:
        return write_rows(self.settings, iterator)


class QueueStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType, *, overwrite: bool) -> None:
        self.settings = sink_settings(options, schema, overwrite=False)

    def write(self, iterator: Iterator[Row]) -> SinkCommit:
        return write_rows(self.settings, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # batchId: Spark's name
        """Nothing to do: every message of the batch was acknowledged before its task ended."""
