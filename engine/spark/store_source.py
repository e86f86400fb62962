"""``rmq_store``: a batch scan of a store directory's CommitLog, one Spark partition per segment.

    df = spark.read.format("rmq_store").option("topics", "orders").load("/var/lib/rmq/store")

This is the CommitLog as it is, independent of the ConsumeQueues and the
index: it reads a live engine's directory (never past the confirmed offset),
a stopped or crashed one, or a store copied from a RocketMQ broker
(``store_view``). Each partition walks one segment with the engine's own
decoder (``CommitLogReader.scan``) and yields Arrow batches of
``arrow_rows.MESSAGE_SCHEMA``.

Options (all optional but the path):

=================  =======  ====================================================
path               --       the store directory (or ``.load(path)``)
topics             all      comma-separated topics to keep
startTimestamp     --       keep messages stored at or after this time (epoch ms)
endTimestamp       --       keep messages stored before this time (epoch ms)
includeBody        true     false leaves ``body`` null (much less to move)
verifyCrc          true     check body and record CRCs, as the engine's reads do
onDamage           fail     fail: a damaged record stops the query; skip: go on
useConsumeQueue    true     let the ConsumeQueues prune segments for topic filters
=================  =======  ====================================================

Filters on ``topic``, ``queue_id`` and ``store_timestamp`` are pushed down
(with ``spark.sql.python.filterPushdown.enabled=true``) and prune segments.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, Filter, InputPartition
from pyspark.sql.types import StructType

from engine.spark.arrow_rows import MESSAGE_SCHEMA, MessageColumns
from engine.spark.options import OptionError, check_known, get_bool, get_choice, get_int, get_str, get_topics
from engine.spark.record_filter import RecordFilter
from engine.spark.segment_plan import SegmentRange, plan_segments
from engine.spark.store_view import StoreSnapshot, take_snapshot
from engine.store.commit_log import CommitLogReader, Damage

SOURCE_NAME = "rmq_store"
KNOWN_OPTIONS = frozenset({"path", "topics", "starttimestamp", "endtimestamp", "includebody", "verifycrc",
                           "ondamage", "useconsumequeue"})
_ZERO_CHECK_CHUNK_BYTES = 1 << 20


class DamagedLogError(RuntimeError):
    """The CommitLog holds bytes that are not a valid record, and ``onDamage`` is ``fail``."""


@dataclass(frozen=True)
class ScanSettings:
    include_body: bool
    verify_crc: bool
    skip_damage: bool


class SegmentPartition(InputPartition):
    """One segment to scan: small and picklable (Spark ships it to an executor)."""

    def __init__(self, snapshot: StoreSnapshot, segment: SegmentRange, wanted: RecordFilter,
                 settings: ScanSettings) -> None:
        super().__init__(segment.start)
        self.snapshot = snapshot
        self.segment = segment
        self.wanted = wanted
        self.settings = settings


class StoreDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return MESSAGE_SCHEMA

    def reader(self, schema: StructType) -> StoreReader:
        return StoreReader(self.options)


class StoreReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        check_known(options, KNOWN_OPTIONS, SOURCE_NAME)
        path = get_str(options, "path")
        if path is None:
            raise OptionError(f"{SOURCE_NAME} needs the store directory: .load(path) or option 'path'")
        self.path = path
        topics = get_topics(options, required=False)
        self.wanted = RecordFilter(topics=frozenset(topics) if topics else None,
                                   start_ms=get_int(options, "startTimestamp", default=None, minimum=0),
                                   end_ms=get_int(options, "endTimestamp", default=None, minimum=0))
        self.settings = ScanSettings(include_body=get_bool(options, "includeBody", default=True),
                                     verify_crc=get_bool(options, "verifyCrc", default=True),
                                     skip_damage=get_choice(options, "onDamage", ("fail", "skip"),
                                                            default="fail") == "skip")
        self.use_consume_queue = get_bool(options, "useConsumeQueue", default=True)
        take_snapshot(path)  # a wrong path fails here, when the DataFrame is defined

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for pushed in filters:
            narrowed = self.wanted.with_pushed(pushed)
            if narrowed is not None:
                self.wanted = narrowed
            yield pushed  # Spark checks every filter again: ours only prune

    def partitions(self) -> Sequence[InputPartition]:
        snapshot = take_snapshot(self.path)
        ranges = plan_segments(snapshot, self.wanted, use_consume_queue=self.use_consume_queue)
        return [SegmentPartition(snapshot, r, self.wanted, self.settings) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SegmentPartition)
        yield from scan_segment(partition.snapshot, partition.segment, partition.wanted, partition.settings)


def scan_segment(snapshot: StoreSnapshot, segment: SegmentRange, wanted: RecordFilter,
                 settings: ScanSettings) -> Iterator[pa.RecordBatch]:
    """Decode one segment's records with the engine's reader and yield the wanted ones in batches."""
    reader = CommitLogReader(snapshot.path, snapshot.segment_size_bytes)
    columns = MessageColumns(include_body=settings.include_body)
    pending: list[Damage] = []
    try:
        for item in reader.scan(segment.start, segment.end, check_crc=settings.verify_crc):
            if isinstance(item, Damage):
                pending.append(item)
                continue
            for damage in pending:  # a valid record follows: this is damage, not the end of the data
                _on_damage(damage, settings)
            pending = []
            if wanted.matches(item) and not snapshot.hides(item.topic, item.commit_log_offset):
                columns.add_record(item)
                if columns.full:
                    yield columns.take()
        for damage in pending:  # after the last record: the unwritten rest, unless it holds bytes
            if damage.reason == "missing segment" or _holds_bytes(reader, damage):
                _on_damage(damage, settings)
        if len(columns):
            yield columns.take()
    finally:
        reader.segments.close()


def _on_damage(damage: Damage, settings: ScanSettings) -> None:
    if not settings.skip_damage:
        raise DamagedLogError(f"commit log bytes [{damage.start}, {damage.end}) hold no valid record "
                              f"({damage.reason}); run `python -m engine check` on the store, or read with "
                              f"option onDamage=skip to leave them out")


def _holds_bytes(reader: CommitLogReader, damage: Damage) -> bool:
    segment = reader.segment_at(damage.start)
    if segment is None:
        return True
    end = min(damage.end, segment.end_offset)
    for at in range(damage.start, end, _ZERO_CHECK_CHUNK_BYTES):
        stop = min(end, at + _ZERO_CHECK_CHUNK_BYTES)
        if segment.mm[at - segment.start_offset:stop - segment.start_offset].strip(b"\x00"):
            return True
    return False
