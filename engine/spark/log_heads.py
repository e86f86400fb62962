"""``rmq_log_heads``: what the rebuild job needs of every record, and every damaged range, per segment.

One partition per segment, scanned with every check the engine's ``check``
applies (``CommitLogReader.scan(..., check_crc=True)`` through a reader made
with ``CommitLogReader.for_config``). A row is either a record's head
(its queue, offsets, tags code, store time and the keys the index builder
would index, in its order: UNIQ_KEY first) or a damaged range with its
reason. Only the segments up to the first missing one are scanned, as a
scan of the whole log stops there.

This source is internal to the rebuild job (``engine.spark.rebuild``); it
is registered by the job, not by ``engine.spark.register``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import ArrayType, BooleanType, IntegerType, LongType, StringType, StructField, StructType

from engine.config import StoreConfig, decode_config, encode_config
from engine.layout import tags_code
from engine.spark.options import OptionError, get_str
from engine.store.commit_log import COMMIT_LOG_DIR, CommitLogReader, Damage
from engine.store.deleted_topics import DeletedTopics
from engine.store.mapped_file import list_files

SOURCE_NAME = "rmq_log_heads"
RECORD, DAMAGE = "record", "damage"
HEADS_SCHEMA = StructType([
    StructField("segment", LongType(), nullable=False),
    StructField("kind", StringType(), nullable=False),
    StructField("commit_log_offset", LongType(), nullable=False),  # a damaged range's start
    StructField("size", LongType(), nullable=False),  # a damaged range's length
    StructField("topic", StringType(), nullable=True),
    StructField("queue_id", IntegerType(), nullable=True),
    StructField("queue_offset", LongType(), nullable=True),
    StructField("tags_code", LongType(), nullable=True),
    StructField("store_timestamp", LongType(), nullable=True),  # epoch ms
    StructField("index_keys", ArrayType(StringType(), containsNull=False), nullable=True),
    StructField("hidden", BooleanType(), nullable=True),  # a record of a deleted topic, from before the deletion
    StructField("reason", StringType(), nullable=True),
    StructField("holds_bytes", BooleanType(), nullable=True),  # damage: not only zeros
])
_ARROW_SCHEMA = to_arrow_schema(HEADS_SCHEMA, timezone="UTC")
_BATCH_ROWS = 8192
_ZERO_CHECK_CHUNK_BYTES = 1 << 20


def contiguous_segments(store_dir: str, segment_size_bytes: int) -> list[int]:
    """Start offsets of the segments a whole-log scan reaches (it stops at the first gap)."""
    starts = [start for start, _path in list_files(Path(store_dir) / COMMIT_LOG_DIR)]
    reached = starts[:1]
    for start in starts[1:]:
        if start != reached[-1] + segment_size_bytes:
            break
        reached.append(start)
    return reached


class LogHeadsDataSource(DataSource):
    """Options: ``path`` (the store) and ``config`` (the engine config as JSON, engine.config.encode_config)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return HEADS_SCHEMA

    def reader(self, schema: StructType) -> LogHeadsReader:
        path, config = get_str(self.options, "path"), get_str(self.options, "config")
        if path is None or config is None:
            raise OptionError(f"{SOURCE_NAME} needs options 'path' and 'config'")
        return LogHeadsReader(path, decode_config(config))


class LogHeadsReader(DataSourceReader):
    def __init__(self, path: str, config: StoreConfig) -> None:
        self.path = path
        self.config_json = encode_config(config).decode()
        self.segment_size_bytes = config.segment_size_bytes
        self.deletion_offsets = DeletedTopics(Path(path)).deletion_offsets

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(start) for start in contiguous_segments(self.path, self.segment_size_bytes)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        reader = CommitLogReader.for_config(Path(self.path), decode_config(self.config_json))
        start = partition.value
        rows: list[dict[str, Any]] = []
        pending: list[Damage] = []
        try:
            for item in reader.scan(start, start + self.segment_size_bytes, check_crc=True):
                if isinstance(item, Damage):
                    pending.append(item)
                    continue
                rows += [_damage_row(start, d, holds_bytes=True) for d in pending]
                pending = []
                rows.append(self._record_row(start, item))
                if len(rows) >= _BATCH_ROWS:
                    yield pa.RecordBatch.from_pylist(rows, schema=_ARROW_SCHEMA)
                    rows = []
            rows += [_damage_row(start, d, holds_bytes=_holds_bytes(reader, d)) for d in pending]
            if rows:
                yield pa.RecordBatch.from_pylist(rows, schema=_ARROW_SCHEMA)
        finally:
            reader.segments.close()

    def _record_row(self, segment: int, record: Any) -> dict[str, Any]:
        uniq = record.uniq_key
        deletion = self.deletion_offsets.get(record.topic)
        return {"segment": segment, "kind": RECORD, "commit_log_offset": record.commit_log_offset,
                "size": record.total_size, "topic": record.topic, "queue_id": record.queue_id,
                "queue_offset": record.queue_offset, "tags_code": tags_code(record.tags),
                "store_timestamp": record.store_timestamp_ms,
                "index_keys": [uniq, *record.keys] if uniq else record.keys,
                "hidden": deletion is not None and record.commit_log_offset < deletion,
                "reason": None, "holds_bytes": None}


def _damage_row(segment: int, damage: Damage, *, holds_bytes: bool) -> dict[str, Any]:
    return {"segment": segment, "kind": DAMAGE, "commit_log_offset": damage.start, "size": damage.end - damage.start,
            "topic": None, "queue_id": None, "queue_offset": None, "tags_code": None, "store_timestamp": None,
            "index_keys": None, "hidden": None, "reason": damage.reason, "holds_bytes": holds_bytes}


def _holds_bytes(reader: CommitLogReader, damage: Damage) -> bool:
    """Whether a damaged range after the last record holds anything but zeros (engine.offline.check)."""
    segment = reader.segment_at(damage.start)
    if segment is None:
        return False
    for at in range(damage.start, damage.end, _ZERO_CHECK_CHUNK_BYTES):
        stop = min(damage.end, at + _ZERO_CHECK_CHUNK_BYTES)
        if segment.mm[at - segment.start_offset:stop - segment.start_offset].strip(b"\x00"):
            return True
    return False
