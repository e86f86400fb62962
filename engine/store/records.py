"""Conversions between client messages and CommitLog records.

``build_items`` validates a client's batch and turns each message into what a
record needs (properties encoded as RocketMQ does). The way back, a record as
a reply carries it, is ``codec.read_view``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from engine import codec, codec_py
from engine.codec_py import ClientMessage, RecordItem
from engine.errors import ErrorCode, RequestError
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
)

_RESERVED_PROPERTIES = (PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_CRC32)
_TAGS = PROPERTY_TAGS + NAME_VALUE_SEPARATOR  # each entry is name \x01 value \x02 (layout.encode_properties)
_KEYS = PROPERTY_KEYS + NAME_VALUE_SEPARATOR
_UNIQ_KEY = PROPERTY_UNIQ_KEY + NAME_VALUE_SEPARATOR
_END = PROPERTY_SEPARATOR


class RecordLimits(Protocol):
    """The settings a batch is held to (``engine.config.StoreConfig`` has them)."""

    @property
    def message_body_bytes_max(self) -> int: ...
    @property
    def properties_bytes_max(self) -> int: ...


class UniqKeys:
    """Message ids in MessageClientIDSetter's shape, for one writer process.

    Layout (16 bytes, upper-case hex): ip (4) | pid (2) | counter >> 16 (4) | time ms (4) | counter (2).
    The pid and the clock come from the actor's ``Env``, so a simulated run makes the same ids
    each time it is replayed."""

    def __init__(self, host: HostAddress, process_id: int) -> None:
        self.prefix = (host.ip + (process_id & 0xFFFF).to_bytes(2, "big")).hex().upper()
        self.next = 0  # the counter of the next message id

    def take(self, count: int, now_ms: int) -> list[str]:
        """``count`` ids sharing one clock reading (a batch is stored at one time)."""
        first, self.next = self.next, self.next + count
        return codec.uniq_keys(self.prefix, first, count, now_ms)


def _check_text(what: str, value: str) -> None:
    if NAME_VALUE_SEPARATOR in value or PROPERTY_SEPARATOR in value:
        raise RequestError(ErrorCode.INVALID_PROPERTY, f"{what} must not contain the characters \\x01 or \\x02")


class BatchItems(NamedTuple):
    """A validated batch, ready for ``CommitLogWriter.append_items``."""

    items: Sequence[RecordItem]  # (body, encoded properties, flag, born timestamp ms) per message
    payload_bytes: int           # the bodies and encoded properties, summed


def build_items(messages: Sequence[ClientMessage], *, config: RecordLimits, uniq_keys: UniqKeys,
                now_ms: int) -> BatchItems:
    """Validate every message of a batch (all or nothing: RequestError names the first refusal)."""
    items, payload = codec.build_items(messages, config.message_body_bytes_max, config.properties_bytes_max,
                                       uniq_keys.take(len(messages), now_ms), now_ms)
    if items is None:
        explain_refusal(messages[payload], config)
        raise RequestError(ErrorCode.INVALID_PROPERTY, f"message {payload} of the batch was refused")
    return BatchItems(items, payload)


def batch_items(records: bytes, *, config: RecordLimits, uniq_keys: UniqKeys, now_ms: int, born_ms: int | None,
                refused_names: tuple[bytes, ...]) -> BatchItems:
    """Check a batch the client encoded (``codec_py.batch_items``): all or nothing, RequestError
    names the first refusal. ``refused_names``: property names only the engine sets."""
    first = uniq_keys.next  # the id of message i, if it has none, is counter first + i
    items, payload = codec.batch_items(records, config.message_body_bytes_max, config.properties_bytes_max,
                                       uniq_keys.prefix, first, now_ms, now_ms if born_ms is None else born_ms,
                                       refused_names)
    if items is None:
        explain_record_refusal(records, payload, config, refused_names)
        raise RequestError(ErrorCode.INVALID_PROPERTY, f"message {payload} of the batch was refused")
    uniq_keys.next = first + len(items)
    return BatchItems(items, payload)


def explain_record_refusal(records: bytes, index: int, config: RecordLimits, refused_names: tuple[bytes, ...]) -> None:
    """Raise the RequestError that says why ``codec.batch_items`` refused message ``index``."""
    entries, cut_at = codec_py.batch_entries(records)
    if index == cut_at:
        what = "holds no message" if not records else f"is cut short or its sizes disagree at message {index}"
        raise RequestError(ErrorCode.MESSAGE_ILLEGAL, f"the batch of records {what} (RocketMQ's MessageBatch "
                                                      f"encoding: TOTALSIZE, MAGICCODE, BODYCRC, FLAG, BODYLEN, "
                                                      f"BODY, PROPLEN, PROPERTIES)")
    _flag, body, raw = entries[index]
    if len(body) > config.message_body_bytes_max:
        _refuse_body(body, config.message_body_bytes_max)
    ok, has_uniq = codec_py.client_properties_ok(raw, refused_names)
    if not ok:
        engine_only = sorted({entry.partition(b"\x01")[0].decode(errors="replace") for entry in raw.split(b"\x02")}
                             & {name.decode() for name in refused_names})
        if engine_only:
            raise RequestError(ErrorCode.INVALID_PROPERTY, f"the properties {', '.join(engine_only)} of message "
                                                           f"{index} are set by the engine only")
        raise RequestError(ErrorCode.INVALID_PROPERTY, f"the properties of message {index} are not entries "
                                                       f"name\\x01value\\x02 of UTF-8 with non-empty names and "
                                                       f"values, each name once, no __CRC32#, no empty key in KEYS")
    size = len(raw) + (0 if has_uniq else len(_UNIQ_KEY) + 32 + len(_END)) + CRC32_RESERVED_BYTES
    raise RequestError(ErrorCode.PROPERTIES_SIZE_EXCEEDED, f"the properties of message {index} take {size} bytes; "
                                                           f"the limit is {config.properties_bytes_max}")


def explain_refusal(message: ClientMessage, config: RecordLimits) -> None:
    """Raise the RequestError that says why ``codec.build_items`` refused ``message``."""
    body = message.body
    if not body or len(body) > config.message_body_bytes_max:
        _refuse_body(body, config.message_body_bytes_max)
    size = 0
    for name, value in message.properties.items():
        _check_text("a property name", name)
        _check_text("a property value", value)
        if not name or name in _RESERVED_PROPERTIES:
            raise RequestError(ErrorCode.INVALID_PROPERTY, f"the property name {name!r} is reserved or empty")
        if not value:
            # RocketMQ's properties parser drops empty values; refuse rather than lose them.
            raise RequestError(ErrorCode.INVALID_PROPERTY, f"the property {name!r} has an empty value")
        size += len(f"{name}{NAME_VALUE_SEPARATOR}{value}{_END}".encode())
    if message.tags:
        _check_text("a tag", message.tags)
        size += len(f"{_TAGS}{message.tags}{_END}".encode())
    if message.keys:
        for key in message.keys:
            _check_text("a key", key)
            if not key or KEY_SEPARATOR in key:
                raise RequestError(ErrorCode.INVALID_PROPERTY, f"the key {key!r} is empty or contains a space")
        size += len(f"{_KEYS}{KEY_SEPARATOR.join(message.keys)}{_END}".encode())
    if PROPERTY_UNIQ_KEY not in message.properties:
        size += len(_UNIQ_KEY) + 32 + len(_END)
    raise RequestError(ErrorCode.PROPERTIES_SIZE_EXCEEDED,
                       f"the properties take {size + CRC32_RESERVED_BYTES} bytes; "
                       f"the limit is {config.properties_bytes_max}")


def _refuse_body(body: bytes, body_max: int) -> None:
    if not body:
        raise RequestError(ErrorCode.MESSAGE_ILLEGAL, "the message body is empty")
    raise RequestError(ErrorCode.MESSAGE_ILLEGAL, f"the message body is {len(body)} bytes; the limit is {body_max}")


def owner_of(topic: str, queue_id: int, owner_count: int) -> int:
    """Which ConsumeQueue owner holds (topic, queue_id): a stable hash, not Python's."""
    return codec.owner_index(topic, queue_id, owner_count)
