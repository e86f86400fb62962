"""How the ``rmq`` source reaches a store's queues: its files (``path``) or a live engine (``endpoint``).

Both transports answer the same questions on the driver (which queues a
topic has, the readable offsets of a queue, the offset for a store time)
and read a planned range ``[start, end)`` of one queue in an executor.
Both are picklable: they hold names and numbers, and open files or sockets
only while they use them.

* ``FileTransport`` reads the ConsumeQueue and CommitLog files through the
  engine's own readers, never past the snapshot's ``read_end``
  (``store_view``). A queue's readable end excludes units whose record is
  not visible yet, and the newest unit if it does not lead to its own record
  (the owner may be writing it at this very moment). Executors must see the
  same files (local mode, or a shared file system).
* ``EndpointTransport`` pulls from a live engine over ZeroMQ
  (``engine.client.StoreClient``), so executors on other machines can read.

Messages that are gone (removed by retention, or damaged and never served)
are data loss: ``DataLossError`` unless ``failOnDataLoss`` is false, in
which case they are skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from engine.client import EngineError, StoreClient
from engine.layout import RecordError
from engine.services.owner.queue_queries import offset_for_time
from engine.spark.arrow_rows import MessageColumns
from engine.spark.store_view import StoreSnapshot, take_snapshot
from engine.store.commit_log import CommitLogReader
from engine.store.consume_queue import ConsumeQueue, list_queues
from engine.store.topics import TopicTable

_NO_LIMIT = 1 << 62
_RETRY_BACKOFF_S_MAX = 0.2

T = TypeVar("T")


class DataLossError(RuntimeError):
    """Planned offsets no longer hold messages (retention, damage), and ``failOnDataLoss`` is true."""


@dataclass(frozen=True)
class QueueRange:
    """Offsets [start, end) of one queue."""

    topic: str
    queue_id: int
    start: int
    end: int


def lost(task: QueueRange, start: int, end: int, reason: str, *, fail: bool) -> None:
    if fail:
        raise DataLossError(f"{task.topic}/{task.queue_id}: queue offsets [{start}, {end}) hold no message any "
                            f"more ({reason}); set option failOnDataLoss=false to skip them")


class FileTransport:
    def __init__(self, path: str, *, fail_on_data_loss: bool) -> None:
        self.path = path
        self.fail_on_data_loss = fail_on_data_loss
        self.snapshot: StoreSnapshot = take_snapshot(path)

    def describe(self) -> str:
        return f"store {self.snapshot.store_dir}"

    def refresh(self) -> None:
        """Look at the store again (driver side, once per plan)."""
        self.snapshot = take_snapshot(self.path)

    def queue_counts(self) -> dict[str, int]:
        """topic -> number of queues, from the topic table and the ConsumeQueue directories."""
        counts = {name: cfg.read_queue_nums for name, cfg in TopicTable(self.snapshot.path).topics.items()}
        for topic, queue_id in list_queues(self.snapshot.path):
            counts[topic] = max(counts.get(topic, 0), queue_id + 1)
        return counts

    def _open(self, topic: str, queue_id: int) -> tuple[ConsumeQueue, CommitLogReader]:
        snap = self.snapshot
        cq = ConsumeQueue(snap.path, topic, queue_id, file_units=snap.consume_queue_file_units, writable=False)
        return cq, CommitLogReader(snap.path, snap.segment_size_bytes)

    def bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """The readable queue offsets [low, high) now."""
        cq, reader = self._open(topic, queue_id)
        try:
            limit = self.snapshot.read_end if self.snapshot.read_end is not None else _NO_LIMIT
            high = _visible_high(cq, reader, limit)
            low = min(cq.first_live_unit(reader.min_offset()), high)
            first = cq.get(low) if low < high else None
            if first is not None and first.is_plausible and self.snapshot.hides(topic, first.commit_log_offset):
                return high, high  # a queue left from before its topic was deleted
            return low, high
        finally:
            cq.close()
            reader.segments.close()

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        cq, reader = self._open(topic, queue_id)
        try:
            limit = self.snapshot.read_end if self.snapshot.read_end is not None else _NO_LIMIT
            return offset_for_time(cq, reader, timestamp_ms=timestamp_ms, upper=False, visible_end=limit)
        finally:
            cq.close()
            reader.segments.close()

    def read(self, task: QueueRange, *, include_body: bool) -> Iterator[pa.RecordBatch]:
        cq, reader = self._open(task.topic, task.queue_id)
        columns = MessageColumns(include_body=include_body)
        limit = self.snapshot.read_end if self.snapshot.read_end is not None else _NO_LIMIT
        try:
            offset = task.start
            low = cq.first_live_unit(reader.min_offset())
            if offset < low:
                lost(task, offset, min(low, task.end), "removed by retention", fail=self.fail_on_data_loss)
                offset = min(low, task.end)
            while offset < task.end:
                units = cq.read(offset, min(task.end - offset, 1024))
                if not units:
                    lost(task, offset, task.end, "no ConsumeQueue units", fail=self.fail_on_data_loss)
                    break
                for unit in units:
                    self._read_unit(task, offset, unit, reader, limit, columns)
                    offset += 1
                    if columns.full:
                        yield columns.take()
            if len(columns):
                yield columns.take()
        finally:
            cq.close()
            reader.segments.close()

    def _read_unit(self, task: QueueRange, offset: int, unit: Any, reader: CommitLogReader, limit: int,
                   columns: MessageColumns) -> None:
        fail = self.fail_on_data_loss
        if unit.is_blank:
            lost(task, offset, offset + 1, "a damaged record left a hole in the queue", fail=fail)
            return
        if unit.commit_log_offset < reader.min_offset():
            lost(task, offset, offset + 1, "removed by retention", fail=fail)
            return
        try:
            record = reader.read(unit.commit_log_offset, limit=limit, check_crc=True)
        except RecordError as exc:
            lost(task, offset, offset + 1, f"the record failed its checks: {exc.reason}", fail=fail)
            return
        if (record.topic, record.queue_id, record.queue_offset, record.total_size) != \
                (task.topic, task.queue_id, offset, unit.size):
            lost(task, offset, offset + 1, "its ConsumeQueue unit leads to another record; run "
                                           "`python -m engine check`", fail=fail)
            return
        columns.add_record(record)


def _visible_high(cq: ConsumeQueue, reader: CommitLogReader, limit: int) -> int:
    """One past the last unit whose record ends at or before ``limit`` and is complete."""
    lo, hi = cq.min_offset, cq.max_offset
    while lo < hi:  # units are in log order: find the first one ending past the limit
        mid = (lo + hi) // 2
        unit = cq.get(mid)
        if unit is not None and unit.is_plausible and unit.commit_log_offset + unit.size > limit:
            hi = mid
        else:
            lo = mid + 1
    high = lo
    newest = cq.get(high - 1) if high > cq.min_offset else None
    if newest is not None and newest.is_plausible and not _leads_to_own_record(cq, reader, high - 1, newest, limit):
        high -= 1  # being written by its owner right now (or damaged: then it is read as such later)
    return high


def _leads_to_own_record(cq: ConsumeQueue, reader: CommitLogReader, queue_offset: int, unit: Any, limit: int) -> bool:
    if unit.commit_log_offset < reader.min_offset():
        return True  # removed by retention: complete, and read as data loss
    try:
        record = reader.read(unit.commit_log_offset, limit=limit, check_crc=False)
    except RecordError:
        return False
    return (record.topic, record.queue_id, record.queue_offset, record.total_size) == \
        (cq.topic, cq.queue_id, queue_offset, unit.size)


class EndpointTransport:
    def __init__(self, endpoint: str, *, fail_on_data_loss: bool, timeout_ms: int, pull_batch: int) -> None:
        self.endpoint = endpoint
        self.fail_on_data_loss = fail_on_data_loss
        self.timeout_ms = timeout_ms
        self.pull_batch = pull_batch
        self._client: StoreClient | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # a socket does not travel to executors
        return state

    def describe(self) -> str:
        return f"engine {self.endpoint}"

    @property
    def client(self) -> StoreClient:
        if self._client is None:
            self._client = StoreClient(self.endpoint, timeout_ms=self.timeout_ms)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def refresh(self) -> None:
        """Nothing to look at again: every question goes to the engine."""

    def queue_counts(self) -> dict[str, int]:
        return {t["topic"]: t["queue_count"] for t in self._call(self.client.list_topics)}

    def bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        stats = self._call(lambda: self.client.queue_stats(topic, queue_id))
        return stats["min_offset"], stats["max_offset"]

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return self._call(lambda: self.client.offset_for_time(topic, queue_id, timestamp_ms))

    def _call(self, request: Callable[[], T]) -> T:
        """A request retried while the engine answers SERVICE_NOT_AVAILABLE (an actor restarting)."""
        deadline = time.monotonic() + self.timeout_ms / 1000
        for attempt in range(1_000_000):
            try:
                return request()
            except EngineError as exc:
                if exc.name != "SERVICE_NOT_AVAILABLE" or time.monotonic() > deadline:
                    raise
            _backoff(attempt)
        raise AssertionError("unreachable")

    def read(self, task: QueueRange, *, include_body: bool) -> Iterator[pa.RecordBatch]:
        columns = MessageColumns(include_body=include_body)
        offset = task.start
        stalled: _Stall | None = None
        try:
            while offset < task.end:
                advanced = self._pull_once(task, offset, columns)
                if advanced > offset:
                    stalled = None
                else:
                    stalled = stalled or _Stall(time.monotonic() + self.timeout_ms / 1000)
                    if stalled.expired():
                        # Planned offsets come from the engine's own max offset; these never came.
                        lost(task, offset, task.end, f"{self.endpoint} did not serve them within {self.timeout_ms} "
                                                     f"ms (did it lose them in a crash?)", fail=self.fail_on_data_loss)
                        break
                    stalled.wait()
                offset = advanced
                if columns.full:
                    yield columns.take()
            if len(columns):
                yield columns.take()
        finally:
            self.close()

    def _pull_once(self, task: QueueRange, offset: int, columns: MessageColumns) -> int:
        """One pull from ``offset``; returns the next offset to pull (``offset`` if nothing was visible)."""
        fail = self.fail_on_data_loss
        try:
            reply = self.client.pull(task.topic, task.queue_id, offset, max_messages=min(task.end - offset,
                                                                                         self.pull_batch))
        except EngineError as exc:
            if exc.name == "MESSAGE_CORRUPT":
                skip_to = min(int(exc.details.get("next_offset", offset + 1)), task.end)
                lost(task, offset, skip_to, "the engine refuses a damaged message", fail=fail)
                return skip_to
            if exc.name == "SERVICE_NOT_AVAILABLE":
                return offset
            raise
        status: str = reply["status"]
        next_offset: int = min(reply["next_offset"], task.end)
        if status == "FOUND":
            for message in reply["messages"]:
                if message["queue_offset"] >= task.end:
                    break
                if message["queue_offset"] > offset:
                    lost(task, offset, message["queue_offset"], "skipped by the engine", fail=fail)
                columns.add_view(message)
                offset = message["queue_offset"] + 1
            return max(offset, next_offset)
        if status in ("OFFSET_TOO_SMALL", "MESSAGE_WAS_REMOVING"):
            lost(task, offset, next_offset, "removed by retention", fail=fail)
            return max(next_offset, offset + 1)
        return offset  # not visible yet (SYNC_FLUSH), or the engine lost it: wait, up to the deadline


@dataclass
class _Stall:
    """Waiting for planned offsets to become visible (a flush under SYNC_FLUSH, an actor restarting)."""

    deadline: float
    attempts: int = 0

    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def wait(self) -> None:
        _backoff(self.attempts)
        self.attempts += 1


def _backoff(attempt: int) -> None:
    """Wait before asking again: an actor restarting, or a flush not yet done. Bounded and growing."""
    time.sleep(min(_RETRY_BACKOFF_S_MAX, 0.005 * 2 ** min(attempt, 10)))


CLUSTER_SEPARATOR = "@"  # "orders@broker-a": topic orders on broker set broker-a (no topic name has an @)


class ClusterTransport:
    """The queues of a cluster of broker sets (docs/cluster.md), read at the set that holds each.

    A topic's queues on set B are those of ``topic@B`` here: offsets, plans and checkpoints name
    them so (``{"orders@broker-a": {"0": 42}}``), since each set numbers its queues from 0, and a
    set that joins later adds keys without moving any. Rows keep the plain topic. The sets come
    from the routes in etcd (``cluster``: its client endpoints), read on the driver when offsets
    are planned and again in each task, so a task after a failover reads at the set's new master.
    ``from_replicas``: read at a replica of each set where it has one (a replica serves what its
    master confirmed)."""

    def __init__(self, etcd_endpoints: tuple[str, ...], cluster_name: str, *, fail_on_data_loss: bool,
                 timeout_ms: int, pull_batch: int, from_replicas: bool) -> None:
        self.etcd_endpoints = etcd_endpoints
        self.cluster_name = cluster_name
        self.fail_on_data_loss = fail_on_data_loss
        self.timeout_ms = timeout_ms
        self.pull_batch = pull_batch
        self.from_replicas = from_replicas
        self.counts: dict[str, int] = {}  # "topic@broker" -> its queue count on that set
        self.sets: dict[str, EndpointTransport] = {}  # broker name -> the transport to the engine read there

    def describe(self) -> str:
        return f"cluster {self.cluster_name!r} (etcd {','.join(self.etcd_endpoints)})"

    def refresh(self) -> None:
        """Routes are read by ``expand``, for the topics asked."""

    def expand(self, topics: tuple[str, ...]) -> dict[str, list[str]]:
        """Each topic's keys (``topic@broker``, one per set serving it), from the routes now."""
        from engine.coordination.etcd import Etcd
        from engine.coordination.routes import topic_route

        etcd = Etcd(list(self.etcd_endpoints), timeout_ms=min(self.timeout_ms, 3_000))
        keys: dict[str, list[str]] = {}
        for topic in topics:
            route = topic_route(etcd, self.cluster_name, topic)
            keys[topic] = []
            for broker in route.brokers:
                endpoint = (broker.replica_endpoints[0] if self.from_replicas and broker.replica_endpoints
                            else broker.master_endpoint)
                if not endpoint:
                    continue  # a set electing its master: its queues are planned at the next trigger
                key = f"{topic}{CLUSTER_SEPARATOR}{broker.broker_name}"
                self.counts[key] = broker.queue_count
                current = self.sets.get(broker.broker_name)
                if current is None or current.endpoint != endpoint:
                    self.sets[broker.broker_name] = EndpointTransport(
                        endpoint, fail_on_data_loss=self.fail_on_data_loss, timeout_ms=self.timeout_ms,
                        pull_batch=self.pull_batch)
                keys[topic].append(key)
        return keys

    def queue_counts(self) -> dict[str, int]:
        return dict(self.counts)

    def _at(self, key: str) -> tuple[EndpointTransport, str]:
        topic, _, broker = key.partition(CLUSTER_SEPARATOR)
        return self.sets[broker], topic

    def bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        transport, plain = self._at(topic)
        return transport.bounds(plain, queue_id)

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        transport, plain = self._at(topic)
        return transport.offset_for_time(plain, queue_id, timestamp_ms)

    def read(self, task: QueueRange, *, include_body: bool) -> Iterator[pa.RecordBatch]:
        plain, _, _broker = task.topic.partition(CLUSTER_SEPARATOR)
        self.expand((plain,))  # the set's engine now (a failover since the plan moves the read)
        transport, _ = self._at(task.topic)
        yield from transport.read(QueueRange(plain, task.queue_id, task.start, task.end), include_body=include_body)

    def close(self) -> None:
        for transport in self.sets.values():
            transport.close()
