"""The client protocol: what any client, in any language, sends and receives.

Transport: ZeroMQ. The client uses a DEALER socket (a REQ socket works too)
and sends one frame per request, a msgpack map with string keys; the reply
is one frame, a msgpack map. Specified for humans in ``docs/protocol.md``;
this module is the machine-checked version of that document.

Every request carries ``v`` (protocol version), ``op`` and ``id`` (any
integer the client chooses; echoed in the reply). Every reply carries ``v``,
``id`` and ``ok``; when ``ok`` is false it carries ``error`` with a stable
numeric ``code`` (``engine.errors.ErrorCode``), its ``name`` and a message.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar, cast

import msgspec
from msgspec import Meta

from engine.errors import ErrorCode, RequestError

PROTOCOL_VERSION = 1
OPS = ("send", "pull", "query_by_key", "query_by_keys", "get_by_id", "create_topic", "list_topics", "ping", "status",
       "commit_offset", "fetch_offset", "queue_stats", "offset_for_time", "get_by_offset", "delete_topic",
       "pop", "ack", "change_invisible", "pop_stats", "end_transaction", "transaction_checks", "route",
       "heartbeat")

INT32_MAX = 0x7FFFFFFF  # a queue id, a flag: Java's int
INT64_MAX = 0x7FFFFFFFFFFFFFFF  # an offset, a time in ms: Java's long
Int32 = Annotated[int, Meta(ge=0, le=INT32_MAX)]
Int64 = Annotated[int, Meta(ge=0, le=INT64_MAX)]
SignedInt32 = Annotated[int, Meta(ge=-0x80000000, le=INT32_MAX)]
TopicName = Annotated[str, Meta(max_length=255)]
GroupName = Annotated[str, Meta(max_length=255)]


class _Request(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    v: int = PROTOCOL_VERSION
    op: str
    id: int = 0


class Envelope(msgspec.Struct, kw_only=True):
    """The fields every actor reads first, to route and to answer errors."""

    v: int = PROTOCOL_VERSION
    op: str = ""
    id: int = 0
    topic: str | None = None
    queue_id: int | None = None
    sharding_key: str | None = None
    group: str | None = None


class SendMessage(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    body: bytes
    tags: str | None = None
    keys: list[str] = []
    properties: dict[str, str] = {}
    flag: SignedInt32 = 0
    born_timestamp: Int64 | None = None


class SendRequest(_Request, kw_only=True):
    topic: TopicName
    queue_id: Int32 | None = None
    sharding_key: Annotated[str, Meta(max_length=4096)] | None = None  # same key, same queue
    # The batch: ``messages``, or ``records`` (the same messages encoded by the client as RocketMQ's
    # MessageBatch body: engine/codec_py.py, ``batch_records``), born at ``born_timestamp`` (the
    # engine's clock when None). A batch of records is a plain send: not delayed, not transactional.
    messages: Annotated[list[SendMessage], Meta(max_length=100_000)] = []
    records: bytes | None = None
    born_timestamp: Int64 | None = None
    wait_store: bool = True
    # A delayed batch waits in the timer until its deliver time (at most one of the three):
    delay_level: Annotated[int, Meta(ge=1, le=1000)] | None = None  # RocketMQ 4's levels (delay_levels_ms)
    delay_ms: Int64 | None = None  # from now
    deliver_at_ms: Int64 | None = None  # wall-clock ms since the epoch
    # A transactional batch is stored as half messages until end_transaction (or a check) decides.
    transaction: bool = False
    producer_group: GroupName | None = None  # whose producers answer the checks; required with transaction
    # Internal only (the transaction actor's commit): the commit log offset of the half message this
    # send commits. The record gets SYSFLAG TRANSACTION_COMMIT_TYPE and it as PREPARED_TX_OFFSET.
    committed_half: Int64 | None = None


class PullRequest(_Request, kw_only=True):
    topic: TopicName
    queue_id: Int32
    offset: Int64
    max_messages: Annotated[int, Meta(ge=1)] = 32
    max_bytes: Annotated[int, Meta(ge=1)] = 4 * 1024 * 1024
    max_wait_ms: Annotated[int, Meta(ge=0)] = 0  # long polling: wait this long for a new message
    subscription: Annotated[str, Meta(max_length=4096)] = "*"  # "*" or "tagA || tagB"


class QueryByKeyRequest(_Request, kw_only=True):
    topic: TopicName
    key: Annotated[str, Meta(min_length=1, max_length=4096)]
    begin_timestamp: Int64 = 0
    end_timestamp: Int64 = 0x7FFFFFFFFFFFFFFF
    max_results: Annotated[int, Meta(ge=1)] = 64


class QueryByKeysRequest(_Request, kw_only=True):
    """``query_by_key`` for many keys in one round trip (at most ``query_keys_per_request_max``)."""

    topic: TopicName
    keys: Annotated[list[Annotated[str, Meta(min_length=1, max_length=4096)]], Meta(min_length=1)]
    begin_timestamp: Int64 = 0
    end_timestamp: Int64 = 0x7FFFFFFFFFFFFFFF
    max_results: Annotated[int, Meta(ge=1)] = 64  # per key


class GetByIdRequest(_Request, kw_only=True):
    msg_id: Annotated[str, Meta(max_length=64)]


class CreateTopicRequest(_Request, kw_only=True):
    topic: TopicName
    queue_count: Annotated[int, Meta(ge=1)] | None = None


class DeleteTopicRequest(_Request, kw_only=True):
    topic: TopicName


class CommitOffsetRequest(_Request, kw_only=True):
    group: GroupName
    topic: TopicName
    queue_id: Int32
    offset: Int64


class FetchOffsetRequest(_Request, kw_only=True):
    group: GroupName
    topic: TopicName
    queue_id: Int32


class QueueStatsRequest(_Request, kw_only=True):
    topic: TopicName
    queue_id: Int32


class OffsetForTimeRequest(_Request, kw_only=True):
    topic: TopicName
    queue_id: Int32
    timestamp: Int64  # store time, ms
    boundary: Literal["lower", "upper"] = "lower"


class GetByOffsetRequest(_Request, kw_only=True):
    commit_log_offset: Int64


class PopRequest(_Request, kw_only=True):
    """Take up to ``max_messages`` for ``group``, each invisible to the group's other pops for
    ``invisible_ms``; from one queue, or (``queue_id`` absent) from the queues of one owner."""

    group: GroupName
    topic: TopicName
    queue_id: Int32 | None = None
    max_messages: Annotated[int, Meta(ge=1)] = 32
    invisible_ms: Annotated[int, Meta(ge=0)] = 30_000
    max_wait_ms: Annotated[int, Meta(ge=0)] = 0
    subscription: Annotated[str, Meta(max_length=4096)] = "*"


ReceiptHandle = Annotated[str, Meta(min_length=1, max_length=128)]


class AckRequest(_Request, kw_only=True):
    """The messages of these receipt handles are done for ``group``; all of one queue.
    ``dead_letter``: done by going to the group's dead-letter topic now (the consumer gave up)."""

    group: GroupName
    topic: TopicName
    queue_id: Int32
    receipt_handles: Annotated[list[ReceiptHandle], Meta(min_length=1, max_length=1024)]
    dead_letter: bool = False


class ChangeInvisibleRequest(_Request, kw_only=True):
    """Make the message invisible for ``invisible_ms`` from now (0: visible again, a nack)."""

    group: GroupName
    topic: TopicName
    queue_id: Int32
    receipt_handle: ReceiptHandle
    invisible_ms: Annotated[int, Meta(ge=0)]


class PopStatsRequest(_Request, kw_only=True):
    group: GroupName
    topic: TopicName
    queue_id: Int32


class EndTransactionRequest(_Request, kw_only=True):
    """Commit or roll back the half message ``msg_id`` (the id its send returned)."""

    msg_id: Annotated[str, Meta(max_length=64)]
    decision: Literal["commit", "rollback"]
    producer_group: GroupName | None = None


class TransactionChecksRequest(_Request, kw_only=True):
    """Take the half messages of ``producer_group`` that wait for a decision past
    ``transaction_timeout_ms``; each must be answered with ``end_transaction``."""

    producer_group: GroupName
    max_messages: Annotated[int, Meta(ge=1, le=1024)] = 32
    max_wait_ms: Annotated[int, Meta(ge=0)] = 0


class HeartbeatRequest(_Request, kw_only=True):
    """A member of ``group`` that shares ``topic``'s queues is alive and wants to hold ``queues``
    (or, with ``leaving``, goes)."""

    group: GroupName
    topic: TopicName
    client_id: Annotated[str, Meta(min_length=1, max_length=255)]
    queues: Annotated[list[Int32], Meta(max_length=65_536)] = []
    held: Annotated[list[Int32], Meta(max_length=65_536)] = []  # the queues it reads now
    seq: Int64 = 0  # the member's heartbeats, numbered: one older than the last taken changes nothing
    leaving: bool = False


RequestT = TypeVar("RequestT", bound=_Request)


class PlainRequest(_Request, kw_only=True):
    """``list_topics``, ``ping`` and ``status`` take no other field."""


class RouteRequest(_Request, kw_only=True):
    """This engine's place in its broker set; with ``topic``, also the broker sets serving it."""

    topic: TopicName | None = None


REQUEST_TYPES: dict[str, type[_Request]] = {
    "send": SendRequest,
    "pull": PullRequest,
    "query_by_key": QueryByKeyRequest,
    "query_by_keys": QueryByKeysRequest,
    "get_by_id": GetByIdRequest,
    "create_topic": CreateTopicRequest,
    "list_topics": PlainRequest,
    "ping": PlainRequest,
    "status": PlainRequest,
    "commit_offset": CommitOffsetRequest,
    "fetch_offset": FetchOffsetRequest,
    "queue_stats": QueueStatsRequest,
    "offset_for_time": OffsetForTimeRequest,
    "get_by_offset": GetByOffsetRequest,
    "delete_topic": DeleteTopicRequest,
    "pop": PopRequest,
    "ack": AckRequest,
    "change_invisible": ChangeInvisibleRequest,
    "pop_stats": PopStatsRequest,
    "end_transaction": EndTransactionRequest,
    "transaction_checks": TransactionChecksRequest,
    "route": RouteRequest,
    "heartbeat": HeartbeatRequest,
}
assert tuple(REQUEST_TYPES) == OPS

_envelope_decoder = msgspec.msgpack.Decoder(Envelope)
_decoders_by_kind = {cls: msgspec.msgpack.Decoder(cls) for cls in set(REQUEST_TYPES.values())}
_encoder = msgspec.msgpack.Encoder()

# msgspec raises more than DecodeError on hostile input: UnicodeDecodeError for
# invalid UTF-8 in a str field, RecursionError for deep nesting (see
# shared/reference/reliability.md section 3.2).
_DECODE_ERRORS = (msgspec.DecodeError, ValueError, RecursionError)


def decode_envelope(frame: bytes | memoryview) -> Envelope:
    """Read the envelope; RequestError for anything that is not a request map."""
    try:
        envelope = _envelope_decoder.decode(frame)
    except msgspec.ValidationError as exc:
        if " - at `$" in str(exc):
            raise RequestError(ErrorCode.INVALID_FIELD, str(exc)) from None
        raise RequestError(ErrorCode.MALFORMED_REQUEST, f"not a request map: {exc}") from None
    except _DECODE_ERRORS as exc:
        raise RequestError(ErrorCode.MALFORMED_REQUEST, f"not valid msgpack: {exc}") from None
    if envelope.v != PROTOCOL_VERSION:
        raise RequestError(ErrorCode.UNSUPPORTED_VERSION, f"protocol version {envelope.v} is not supported; "
                                                          f"this engine speaks {PROTOCOL_VERSION}")
    if envelope.op not in REQUEST_TYPES:
        raise RequestError(ErrorCode.UNKNOWN_OP, f"unknown op {envelope.op!r}; known ops: {', '.join(OPS)}")
    return envelope


def decode_request(op: str, frame: bytes | memoryview) -> _Request:
    return decode_as(REQUEST_TYPES[op], frame)


def decode_as(kind: type[RequestT], frame: bytes | memoryview) -> RequestT:
    """The request ``frame`` holds, as ``kind``; RequestError if it is not one."""
    try:
        return cast(RequestT, _decoders_by_kind[kind].decode(frame))
    except msgspec.ValidationError as exc:
        raise RequestError(ErrorCode.INVALID_FIELD, str(exc)) from None
    except _DECODE_ERRORS as exc:
        raise RequestError(ErrorCode.MALFORMED_REQUEST, f"not valid msgpack: {exc}") from None


class ErrorInfo(msgspec.Struct):
    code: int
    name: str
    message: str


class MessageView(msgspec.Struct, kw_only=True):
    """One stored message as a reply carries it."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_size: int
    msg_id: str
    body: bytes
    body_crc: int
    tags: str | None
    keys: list[str]
    uniq_key: str | None
    properties: dict[str, str]
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    reconsume_times: int


class SendResult(msgspec.Struct, kw_only=True):
    status: str
    status_code: int
    msg_id: str = ""
    queue_id: int = -1
    queue_offset: int = -1
    commit_log_offset: int = -1
    store_timestamp: int = 0


class Reply(msgspec.Struct, kw_only=True):
    """What every reply carries (section 3.2 of ``docs/protocol.md``): ``ok`` false has ``error``.

    The reply structs below are what an actor that is a client of the front (the timer, the
    transaction actor) decodes. They name the fields the engine sends for their op and ignore
    any other, so the protocol can grow without breaking them; a refusal leaves the op's own
    fields at their defaults."""

    v: int = PROTOCOL_VERSION
    id: int = 0
    ok: bool = False
    error: ErrorInfo | None = None


class SendReply(Reply, kw_only=True):
    """``send`` (section 4.1): one result per message, in request order."""

    results: list[SendResult] = []


class PullReply(Reply, kw_only=True):
    """``pull`` (section 4.2). ``next_offset`` also comes beside an ``error`` where the queue goes on."""

    status: str = ""
    status_code: int = -1
    next_offset: int | None = None
    min_offset: int = 0
    max_offset: int = 0
    messages: list[MessageView] = []


def encode_reply(request_id: int, **fields: object) -> bytes:
    return _encoder.encode({"v": PROTOCOL_VERSION, "id": request_id, "ok": True, **fields})


def encode_error(request_id: int, code: ErrorCode, message: str, **details: object) -> bytes:
    """An error reply; ``details`` (such as ``next_offset``) go beside ``error``."""
    return _encoder.encode({"v": PROTOCOL_VERSION, "id": request_id, "ok": False,
                            "error": ErrorInfo(int(code), code.name, message), **details})


def encode_request(op: str, request_id: int, **fields: object) -> bytes:
    return _encoder.encode({"v": PROTOCOL_VERSION, "op": op, "id": request_id, **fields})


class _IdOnly(msgspec.Struct):
    id: int = 0


_id_decoder = msgspec.msgpack.Decoder(_IdOnly)
_untyped_decoder = msgspec.msgpack.Decoder()


def safe_request_id(frame: bytes | memoryview) -> int:
    """The request id if the frame has a readable integer one, else 0 (for error replies)."""
    try:
        return _id_decoder.decode(frame).id
    except (*_DECODE_ERRORS, msgspec.ValidationError):
        pass
    try:  # other fields are broken: look at the id alone
        request = _untyped_decoder.decode(frame)
    except (*_DECODE_ERRORS, msgspec.ValidationError):
        return 0
    request_id = request.get("id") if isinstance(request, dict) else None
    return request_id if isinstance(request_id, int) and not isinstance(request_id, bool) else 0


STOPPING_MESSAGE = "the engine is stopping: nothing of this request was done; send it again once the engine runs"


def encode_stopping(frame: bytes | memoryview) -> bytes:
    """The answer to a request still queued when the process that serves it stopped: at once,
    rather than left to the client's deadline (``Actor.refuse_at_stop``)."""
    return encode_error(safe_request_id(frame), ErrorCode.SERVICE_NOT_AVAILABLE, STOPPING_MESSAGE)
