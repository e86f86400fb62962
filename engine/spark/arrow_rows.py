"""The message schema shared by every reader, and the columnar builder that fills Arrow batches.

One row per message, with the fields of the engine's message object
(``engine.codec_py.read_view``, docs/protocol.md section 6) under the same
names; the two timestamps are Spark timestamps (UTC) instead of epoch
milliseconds. Readers yield ``pyarrow.RecordBatch``es whose schema is exactly
what Spark derives from ``MESSAGE_SCHEMA``: Spark refuses any other.

A row is built either from a decoded CommitLog record (file readers) or
from a message object of a pull reply (the endpoint transport); both give
the same values for the same message.
"""

from __future__ import annotations

import functools
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from engine.layout import (
    KEY_SEPARATOR,
    PROPERTY_CRC32,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    HostAddress,
    Record,
    encode_msg_id,
)

MESSAGE_SCHEMA = StructType([
    StructField("topic", StringType(), nullable=False),
    StructField("queue_id", IntegerType(), nullable=False),
    StructField("queue_offset", LongType(), nullable=False),
    StructField("commit_log_offset", LongType(), nullable=False),
    StructField("msg_id", StringType(), nullable=False),
    StructField("keys", ArrayType(StringType(), containsNull=False), nullable=False),
    StructField("tags", StringType(), nullable=True),
    StructField("uniq_key", StringType(), nullable=True),
    StructField("properties", MapType(StringType(), StringType(), valueContainsNull=False), nullable=False),
    StructField("flag", IntegerType(), nullable=False),
    StructField("sys_flag", IntegerType(), nullable=False),
    StructField("born_timestamp", TimestampType(), nullable=False),
    StructField("born_host", StringType(), nullable=False),
    StructField("store_timestamp", TimestampType(), nullable=False),
    StructField("store_host", StringType(), nullable=False),
    StructField("store_size", IntegerType(), nullable=False),
    StructField("body_crc", IntegerType(), nullable=False),
    StructField("reconsume_times", IntegerType(), nullable=False),
    StructField("body", BinaryType(), nullable=True),
])
ARROW_SCHEMA = to_arrow_schema(MESSAGE_SCHEMA, timezone="UTC")
COLUMNS = tuple(MESSAGE_SCHEMA.fieldNames())
_MS_TIMESTAMP = pa.timestamp("ms", tz="UTC")
_TIMESTAMP_COLUMNS = frozenset(("born_timestamp", "store_timestamp"))
BATCH_ROWS_DEFAULT = 4096

assert len(COLUMNS) == 19 and COLUMNS[-1] == "body"


class MessageColumns:
    """Column lists filled one message at a time, turned into a RecordBatch when full.

    ``keys`` and ``properties`` are kept flat (values plus offsets), so that a batch is
    built from a few long lists rather than from a small list or dict per row.
    """

    def __init__(self, *, include_body: bool, batch_rows: int = BATCH_ROWS_DEFAULT) -> None:
        assert batch_rows > 0
        self.include_body = include_body
        self.batch_rows = batch_rows
        self._reset()

    def _reset(self) -> None:
        self.scalars: list[list[Any]] = [[] for _ in _SCALAR_COLUMNS]
        self._appends = tuple(column.append for column in self.scalars)
        self.key_values: list[str] = []
        self.key_offsets: list[int] = [0]
        self.property_names: list[str] = []
        self.property_values: list[str] = []
        self.property_offsets: list[int] = [0]
        self.bytes = 0  # body bytes held (a batch is also cut at 64 MiB of bodies)

    def __len__(self) -> int:
        return len(self.scalars[0])

    @property
    def full(self) -> bool:
        return len(self) >= self.batch_rows or self.bytes >= 64 << 20

    def add_record(self, record: Record) -> None:
        """A record decoded from the CommitLog (``engine.layout.decode_record``)."""
        body = bytes(record.body) if self.include_body else None
        properties = record.properties
        keys = properties.get(PROPERTY_KEYS)
        self._add_keys(keys.split(KEY_SEPARATOR) if keys else ())
        self._add_properties((k, v) for k, v in properties.items() if k not in _HIDDEN_PROPERTIES)
        self._add_scalars(record.topic, record.queue_id, record.queue_offset, record.commit_log_offset,
                          _msg_id_prefix(record.store_host) + format(record.commit_log_offset, "016X"),
                          properties.get(PROPERTY_TAGS), properties.get(PROPERTY_UNIQ_KEY), record.flag,
                          record.sys_flag, record.born_timestamp_ms, str(record.born_host), record.store_timestamp_ms,
                          str(record.store_host), record.total_size, record.body_crc, record.reconsume_times, body)

    def add_view(self, message: dict[str, Any]) -> None:
        """A message object of a pull reply (docs/protocol.md section 6)."""
        body = message["body"] if self.include_body else None
        self._add_keys(message["keys"])
        self._add_properties(message["properties"].items())
        self._add_scalars(message["topic"], message["queue_id"], message["queue_offset"],
                          message["commit_log_offset"], message["msg_id"], message["tags"], message["uniq_key"],
                          message["flag"], message["sys_flag"], message["born_timestamp"], message["born_host"],
                          message["store_timestamp"], message["store_host"], message["store_size"],
                          message["body_crc"], message["reconsume_times"], body)

    def _add_keys(self, keys: Any) -> None:
        self.key_values.extend(k for k in keys if k)
        self.key_offsets.append(len(self.key_values))

    def _add_properties(self, items: Any) -> None:
        for name, value in items:
            self.property_names.append(name)
            self.property_values.append(value)
        self.property_offsets.append(len(self.property_names))

    def _add_scalars(self, *values: Any) -> None:
        body = values[-1]
        self.bytes += len(body) if body is not None else 0
        for append, value in zip(self._appends, values, strict=True):
            append(value)

    def take(self) -> pa.RecordBatch:
        """The rows added since the last take, as one batch with Spark's Arrow schema."""
        arrays: dict[str, pa.Array] = {}
        for name, values in zip(_SCALAR_COLUMNS, self.scalars, strict=True):
            field = ARROW_SCHEMA.field(name)
            if name in _TIMESTAMP_COLUMNS:
                arrays[name] = pa.array(values, type=_MS_TIMESTAMP).cast(field.type)
            else:
                arrays[name] = pa.array(values, type=field.type)
        keys_type = ARROW_SCHEMA.field("keys").type
        arrays["keys"] = pa.ListArray.from_arrays(pa.array(self.key_offsets, pa.int32()),
                                                  pa.array(self.key_values, keys_type.value_type), type=keys_type)
        arrays["properties"] = pa.MapArray.from_arrays(pa.array(self.property_offsets, pa.int32()),
                                                       pa.array(self.property_names, pa.string()),
                                                       pa.array(self.property_values, pa.string()),
                                                       type=ARROW_SCHEMA.field("properties").type)
        self._reset()
        return pa.RecordBatch.from_arrays([arrays[name] for name in COLUMNS], schema=ARROW_SCHEMA)


_SCALAR_COLUMNS = tuple(c for c in COLUMNS if c not in ("keys", "properties"))
_HIDDEN_PROPERTIES = frozenset((PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_CRC32))  # Record.user_properties


@functools.lru_cache(maxsize=64)
def _msg_id_prefix(store_host: HostAddress) -> str:
    """An offsetMsgId without its 16 hex digits of offset (``layout.encode_msg_id``): store ip and port."""
    return encode_msg_id(store_host, 0)[:-16]
