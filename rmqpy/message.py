"""The typed values of the client: a message to send, a message read, a send's result.

They are frozen ``msgspec.Struct``s: cheap to build from a decoded reply, safe to share
between threads, and comparable field by field. Field names are the protocol's
(docs/protocol.md 4.1 and 6.1), so the protocol document describes each one; the
docstrings here say what matters to an application.

The ``*_from_wire`` functions turn the maps the engine sends into these types. They
ignore reply fields they do not know, as the protocol asks (1.3): an engine that adds a
field does not break this library.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from engine.errors import PutStatus

__all__ = ["Message", "OutgoingMessage", "SendResult", "message_from_wire", "messages_from_wire",
           "outgoing_to_wire", "popped_from_wire", "send_results_from_wire"]


class OutgoingMessage(msgspec.Struct, frozen=True, kw_only=True):
    """A message to send: ``Producer.send_batch`` takes a sequence of them."""

    body: bytes
    """1 byte to 4 MiB (the engine's ``message_body_bytes_max``)."""
    keys: tuple[str, ...] = ()
    """Business keys, each non-empty and without spaces; ``query_by_key`` finds the message by any."""
    tags: str | None = None
    """One tag; consumers subscribe to tags (``"paid || refunded"``)."""
    properties: dict[str, str] = {}
    """User properties, names and values without ``\\x01``/``\\x02``; no empty values."""
    flag: int = 0
    """RocketMQ's 32-bit flag, stored and returned unchanged."""
    born_timestamp: int | None = None
    """Milliseconds since the epoch; None lets the engine use its clock."""

    def __post_init__(self) -> None:
        if not isinstance(self.body, bytes):
            raise TypeError(f"body must be bytes, not {type(self.body).__name__}: encode text first")
        if isinstance(self.keys, str):
            raise TypeError("keys must be a sequence of keys, not one string")


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """A stored message, as a pull, a pop or a lookup returns it.

    ``msg_id`` names the record (its commit log offset, section 6.2 of the protocol);
    ``uniq_key`` names the message across a delay, a transaction and a retry.
    A popped message also carries its ``receipt_handle`` and ``attempt``.
    """

    topic: str
    queue_id: int
    queue_offset: int
    """The message's place in its queue: 0, 1, 2, ..."""
    msg_id: str
    """32 hex characters: the store's address and the record's commit log offset."""
    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    uniq_key: str | None = None
    """The producer's id for the message (``UNIQ_KEY``); the same on a delayed or committed delivery."""
    properties: dict[str, str] = {}
    """User properties plus ``UNIQ_KEY`` and those the engine wrote (``ORIGIN_OFFSET``, ``DELAY``, ...)."""
    flag: int = 0
    born_timestamp: int
    """Milliseconds since the epoch when the producer made it (or the engine received it)."""
    store_timestamp: int
    """Milliseconds since the epoch when the engine stored it; never decreases along the log."""
    born_host: str = ""
    store_host: str = ""
    commit_log_offset: int
    store_size: int
    """Bytes of the stored record, what a pull's byte budget counts."""
    body_crc: int = 0
    sys_flag: int = 0
    reconsume_times: int = 0
    """Always 0 in this engine; a popped message's ``attempt`` counts deliveries."""
    receipt_handle: str | None = None
    """Popped messages only: names this delivery; ack, nack and change of invisible time take it."""
    attempt: int | None = None
    """Popped messages only: 1 for the first delivery to the group, then 2, 3, ..."""


class SendResult(msgspec.Struct, frozen=True, kw_only=True):
    """Where a sent message was stored.

    A delayed or transactional send stores the message in a system topic first: then
    ``queue_id``, ``queue_offset``, ``msg_id`` and ``commit_log_offset`` are those of the
    record that waits there, and the delivered message gets a new ``msg_id``. Follow such
    a message by its ``uniq_key``, which it keeps.
    """

    topic: str
    """The topic the message was sent to."""
    status: str
    """``PUT_OK``, or ``FLUSH_DISK_TIMEOUT`` under ``SYNC_FLUSH`` (written, not known to be on disk)."""
    status_code: int
    msg_id: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_timestamp: int
    uniq_key: str | None = None
    """The message's ``UNIQ_KEY``, made by the producer (None if the engine made it)."""
    broker_name: str = ""
    """The broker set that stored it, when sent through a ``ClusterProducer`` ("" otherwise)."""
    epoch: int = 0
    """The epoch of the broker set's master that stored it (0: an engine not elected on etcd).
    Two sends acknowledged in one epoch were stored by one engine, in that order."""

    @property
    def ok(self) -> bool:
        """Stored as asked: ``PUT_OK``."""
        return self.status_code == PutStatus.PUT_OK


def outgoing_to_wire(message: OutgoingMessage, uniq_key: str | None) -> dict[str, Any]:
    """The message map of a ``send`` request, with ``uniq_key`` as its ``UNIQ_KEY`` unless it has one."""
    properties = dict(message.properties)
    if uniq_key is not None:
        properties.setdefault("UNIQ_KEY", uniq_key)
    wire: dict[str, Any] = {"body": message.body, "keys": list(message.keys), "properties": properties}
    if message.tags is not None:
        wire["tags"] = message.tags
    if message.flag:
        wire["flag"] = message.flag
    if message.born_timestamp is not None:
        wire["born_timestamp"] = message.born_timestamp
    return wire


def message_from_wire(fields: Mapping[str, Any]) -> Message:
    return msgspec.convert(fields, Message)


def messages_from_wire(fields: Iterable[Mapping[str, Any]]) -> list[Message]:
    return [msgspec.convert(m, Message) for m in fields]


def popped_from_wire(reply: Mapping[str, Any]) -> list[Message]:
    """A ``pop`` reply's messages, each with its receipt handle and attempt."""
    triples = zip(reply["messages"], reply["receipt_handles"], reply["attempts"], strict=True)
    return [msgspec.convert({**m, "receipt_handle": handle, "attempt": attempt}, Message)
            for m, handle, attempt in triples]


def send_results_from_wire(topic: str, results: Sequence[Mapping[str, Any]],
                           uniq_keys: Sequence[str | None], epoch: int = 0) -> list[SendResult]:
    """A ``send`` reply's results, in request order, with the uniq_keys the request carried and the
    reply's epoch."""
    assert len(results) == len(uniq_keys), (len(results), len(uniq_keys))
    return [msgspec.convert({**r, "topic": topic, "uniq_key": key, "epoch": epoch}, SendResult)
            for r, key in zip(results, uniq_keys, strict=True)]
