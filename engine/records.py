"""Conversions between client messages and CommitLog records.

``build_fields`` validates a client's message and turns it into the fields of
a record (properties encoded as RocketMQ does); ``message_view`` turns a
decoded record back into what a reply carries.
"""

from __future__ import annotations

import itertools
import os
import time
import zlib

from engine.config import StoreConfig
from engine.errors import ErrorCode, RequestError
from engine.ipc.protocol import MessageView, SendMessage
from engine.layout import (
    CRC32_RESERVED_BYTES,
    KEY_SEPARATOR,
    NAME_VALUE_SEPARATOR,
    PROPERTY_CRC32,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    HostAddress,
    Record,
    RecordFields,
    encode_properties,
)

_FORBIDDEN = (NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR)
_RESERVED_PROPERTIES = (PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_CRC32)
_uniq_counter = itertools.count()
_uniq_prefix = (os.getpid() & 0xFFFF).to_bytes(2, "big")


def new_uniq_key(host: HostAddress) -> str:
    """A message id in MessageClientIDSetter's shape: ip, pid, time, counter (32 hex chars)."""
    now_ms = time.time_ns() // 1_000_000
    seq = next(_uniq_counter)
    raw = host.ip + _uniq_prefix + (seq >> 16 & 0xFFFFFFFF).to_bytes(4, "big") \
        + (now_ms & 0xFFFFFFFF).to_bytes(4, "big") + (seq & 0xFFFF).to_bytes(2, "big")
    return raw.hex().upper()


def _check_text(what: str, value: str) -> None:
    if any(sep in value for sep in _FORBIDDEN):
        raise RequestError(ErrorCode.INVALID_PROPERTY, f"{what} must not contain the characters \\x01 or \\x02")


def build_fields(message: SendMessage, *, topic: bytes, queue_id: int, config: StoreConfig,
                 born_host: HostAddress, now_ms: int) -> RecordFields:
    """Validate one client message and return its record fields; RequestError if refused."""
    if not message.body:
        raise RequestError(ErrorCode.MESSAGE_ILLEGAL, "the message body is empty")
    if len(message.body) > config.message_body_bytes_max:
        raise RequestError(ErrorCode.MESSAGE_ILLEGAL, f"the message body is {len(message.body)} bytes; "
                                                      f"the limit is {config.message_body_bytes_max}")
    properties: dict[str, str] = {}
    for name, value in message.properties.items():
        _check_text("a property name", name)
        _check_text("a property value", value)
        if not name or name in _RESERVED_PROPERTIES:
            raise RequestError(ErrorCode.INVALID_PROPERTY, f"the property name {name!r} is reserved or empty")
        if not value:
            # RocketMQ's properties parser drops empty values; refuse rather than lose them.
            raise RequestError(ErrorCode.INVALID_PROPERTY, f"the property {name!r} has an empty value")
        properties[name] = value
    if message.tags:
        _check_text("a tag", message.tags)
        properties[PROPERTY_TAGS] = message.tags
    if message.keys:
        for key in message.keys:
            _check_text("a key", key)
            if not key or KEY_SEPARATOR in key:
                raise RequestError(ErrorCode.INVALID_PROPERTY, f"the key {key!r} is empty or contains a space")
        properties[PROPERTY_KEYS] = KEY_SEPARATOR.join(message.keys)
    if PROPERTY_UNIQ_KEY not in properties:
        properties[PROPERTY_UNIQ_KEY] = new_uniq_key(born_host)
    encoded = encode_properties(properties)
    if len(encoded) + CRC32_RESERVED_BYTES > config.properties_bytes_max:
        raise RequestError(ErrorCode.PROPERTIES_SIZE_EXCEEDED,
                           f"the properties take {len(encoded) + CRC32_RESERVED_BYTES} bytes; "
                           f"the limit is {config.properties_bytes_max}")
    born = message.born_timestamp if message.born_timestamp is not None else now_ms
    return RecordFields(topic, queue_id, message.body, encoded, message.flag, born, born_host)


def message_view(record: Record) -> MessageView:
    return MessageView(
        topic=record.topic, queue_id=record.queue_id, queue_offset=record.queue_offset,
        commit_log_offset=record.commit_log_offset, store_size=record.total_size, msg_id=record.msg_id,
        body=bytes(record.body), body_crc=record.body_crc, tags=record.tags, keys=record.keys,
        uniq_key=record.uniq_key, properties=record.user_properties(), flag=record.flag,
        sys_flag=record.sys_flag, born_timestamp=record.born_timestamp_ms, born_host=str(record.born_host),
        store_timestamp=record.store_timestamp_ms, store_host=str(record.store_host),
        reconsume_times=record.reconsume_times)


def owner_of(topic: str, queue_id: int, owner_count: int) -> int:
    """Which ConsumeQueue owner holds (topic, queue_id): a stable hash, not Python's."""
    return zlib.crc32(f"{topic}/{queue_id}".encode()) % owner_count
