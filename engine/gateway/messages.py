"""RocketMQ 5 API messages (``apache.rocketmq.v2.Message``) to the engine's message maps
(``docs/protocol.md`` 4.1 and 6.1) and back.

What goes where when a message is sent through the API and read back:

    v2 Message                         engine message                      stored as
    ---------------------------------  ----------------------------------  ---------------------------
    body (IDENTITY, or GZIP: inflated)  body                                the record's body
    system_properties.tag               tags                                TAGS
    system_properties.keys              keys                                KEYS (space-joined)
    system_properties.message_id        properties["UNIQ_KEY"]              UNIQ_KEY: the message id
    system_properties.message_group     sharding_key, properties[GROUP]     __SHARDINGKEY (RocketMQ's)
    system_properties.born_timestamp    born_timestamp (ms)                 BORNTIMESTAMP
    system_properties.delivery_timestamp  the send's deliver_at_ms          TIMER_OUT_MS, until delivered;
                                                                        then TIMER_DELIVER_MS
    message_type TRANSACTION            the send's transaction, with the    TRAN_MSG, PGROUP (a half
                                        topic as producer_group (as RocketMQ's proxy does)  message until decided)
    user_properties                     properties                          the user properties

On the way back the message id is the UNIQ_KEY (the id the client made at send, as
RocketMQ's proxy answers), the type is FIFO when the message has a group, and the body
carries its MD5 digest, which the clients check.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import Code, DigestType, Encoding, MessageType, definition_pb2

from engine.store.system_topics import PROPERTY_TIMER_DELIVER_MS, SYSTEM_PROPERTIES

UNIQ_KEY = "UNIQ_KEY"
MESSAGE_GROUP = "__SHARDINGKEY"  # RocketMQ's MessageConst.PROPERTY_SHARDING_KEY
_HIDDEN = frozenset({UNIQ_KEY, MESSAGE_GROUP, *SYSTEM_PROPERTIES})


class Outgoing(NamedTuple):
    """A SendMessageRequest as one engine ``send``."""

    topic: str
    group: str | None
    messages: list[dict[str, Any]]
    deliver_at_ms: int | None
    transactional: bool


class Refused(Exception):
    """A request the endpoint answers with a status of its own, without asking the engine."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def to_ms(stamp: Timestamp) -> int:
    seconds: int = stamp.seconds  # google.protobuf ships no stubs: its fields are Any
    nanos: int = stamp.nanos
    return seconds * 1000 + nanos // 1_000_000


def timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def duration(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def duration_ms(value: Duration) -> int:
    seconds: int = value.seconds
    nanos: int = value.nanos
    return seconds * 1000 + nanos // 1_000_000


def outgoing(messages: Iterable[definition_pb2.Message], *, body_bytes_max: int) -> Outgoing:
    """A SendMessageRequest as one engine send; Refused for what one send cannot carry: several
    topics, groups, deliver times or kinds, and lite topics."""
    topics: set[str] = set()
    groups: set[str] = set()  # "" for a message without one
    times: set[int | None] = set()
    kinds: set[bool] = set()  # transactional or not
    converted = []
    for message in messages:
        system = message.system_properties
        topics.add(message.topic.name)
        if system.message_type not in _ACCEPTED or system.lite_topic:
            raise Refused(Code.UNSUPPORTED, f"messages of type {system.message_type} are not supported")
        properties = dict(message.user_properties)
        if not system.message_id:
            raise Refused(Code.ILLEGAL_MESSAGE_ID, "system_properties.message_id is required")
        properties[UNIQ_KEY] = system.message_id
        groups.add(system.message_group)
        times.add(to_ms(system.delivery_timestamp) if system.HasField("delivery_timestamp") else None)
        kinds.add(system.message_type == _TRANSACTION)
        if system.message_group:
            properties[MESSAGE_GROUP] = system.message_group
        entry: dict[str, Any] = {"body": _body(message.body, system.body_encoding, body_bytes_max),
                                 "keys": list(system.keys), "properties": properties}
        if system.tag:
            entry["tags"] = system.tag
        if system.HasField("born_timestamp"):
            entry["born_timestamp"] = to_ms(system.born_timestamp)
        converted.append(entry)
    if len(topics) != 1:
        raise Refused(Code.BAD_REQUEST, "a SendMessageRequest needs 1 or more messages, all of one topic")
    if len(groups) > 1:
        raise Refused(Code.ILLEGAL_MESSAGE_GROUP, "the messages of one SendMessageRequest must share one message group")
    if len(times) > 1 or len(kinds) > 1:
        raise Refused(Code.BAD_REQUEST, "the messages of one SendMessageRequest must share one delivery timestamp "
                                        "and one kind (transactional or not)")
    return Outgoing(topics.pop(), groups.pop() or None, converted, times.pop(), kinds.pop())


# Enum values as plain ints: protobuf's enum wrappers resolve each attribute in Python.
_ACCEPTED = frozenset(int(t) for t in (MessageType.MESSAGE_TYPE_UNSPECIFIED, MessageType.NORMAL, MessageType.FIFO,
                                       MessageType.DELAY, MessageType.TRANSACTION))
_TRANSACTION = int(MessageType.TRANSACTION)
_GZIP = int(Encoding.GZIP)
# The body digest as RocketMQ's proxy gives it: MD5, uppercase hex. The clients agree on that
# one; their CRC32 strings differ (the Node client writes it in decimal, the Python one in hex).
_MD5 = int(DigestType.MD5)


def _md5(body: bytes) -> str:
    return hashlib.md5(body, usedforsecurity=False).hexdigest().upper()


def _body(body: bytes, encoding: int, body_bytes_max: int) -> bytes:
    if encoding != _GZIP:
        return body
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        plain = inflater.decompress(body, body_bytes_max + 1)
    except zlib.error as exc:
        raise Refused(Code.MESSAGE_CORRUPTED, f"the GZIP body does not inflate: {exc}") from None
    if len(plain) > body_bytes_max:
        raise Refused(Code.MESSAGE_BODY_TOO_LARGE, f"the inflated body exceeds {body_bytes_max} bytes")
    return plain


def _message_type(properties: Mapping[str, str], group: str | None) -> int:
    if "TRAN_MSG" in properties:
        return _TRANSACTION
    return int(MessageType.FIFO) if group else int(MessageType.NORMAL)


def message_id(message: Mapping[str, Any]) -> str:
    """The id a client knows the message by: its UNIQ_KEY, else the offsetMsgId."""
    known_by: str = message.get("uniq_key") or message["msg_id"]
    return known_by


def incoming(message: Mapping[str, Any], *, invisible_ms: int | None = None) -> definition_pb2.Message:
    """A stored message (as ``pull`` or ``pop`` gives it) as the API's Message."""
    properties = message["properties"]
    body = message["body"]
    group = properties.get(MESSAGE_GROUP)
    system = definition_pb2.SystemProperties(
        keys=message["keys"], message_id=message_id(message),
        body_digest=definition_pb2.Digest(type=_MD5, checksum=_md5(body)),
        body_encoding=Encoding.IDENTITY, message_type=_message_type(properties, group),
        born_timestamp=timestamp(message["born_timestamp"]), born_host=message["born_host"],
        store_timestamp=timestamp(message["store_timestamp"]), store_host=message["store_host"],
        queue_id=message["queue_id"], queue_offset=message["queue_offset"])
    if message["tags"]:
        system.tag = message["tags"]
    if group:
        system.message_group = group
    if PROPERTY_TIMER_DELIVER_MS in properties:  # a delivered delayed message, as RocketMQ's proxy answers it
        system.delivery_timestamp.CopyFrom(timestamp(int(properties[PROPERTY_TIMER_DELIVER_MS])))
    if "receipt_handle" in message:
        system.receipt_handle = message["receipt_handle"]
        system.delivery_attempt = message["attempt"]
    if invisible_ms is not None:
        system.invisible_duration.CopyFrom(duration(invisible_ms))
    return definition_pb2.Message(
        topic=definition_pb2.Resource(name=message["topic"]),
        user_properties={k: v for k, v in properties.items() if k not in _HIDDEN},
        system_properties=system, body=body)
