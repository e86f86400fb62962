"""What the blocking and the asyncio producers share: uniq keys and the fields of a send.

The producer gives each message its ``UNIQ_KEY`` before sending it, as RocketMQ's
clients make the message id: the application learns the id from the ``SendResult``
even for a delayed message (whose record ids change on delivery), and a send retried
after a ``BUSY`` carries the same ids, so nothing can be told apart from the first try.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from rmqpy.message import OutgoingMessage, outgoing_to_wire

UNIQ_KEY = "UNIQ_KEY"


class UniqKeys:
    """32 uppercase hex characters, unique per producer: 8 random bytes, then a counter.

    The shape is the one the engine makes (docs/protocol.md 6.3); the random prefix
    (with the process id in it) keeps two producers apart, the counter keeps one
    producer's messages apart. Thread-safe: a lock guards the counter.
    """

    def __init__(self) -> None:
        prefix = (os.getpid() & 0xFFFF).to_bytes(2, "big") + os.urandom(6)
        self._prefix = prefix.hex().upper()
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def next(self) -> str:
        with self._lock:
            n = next(self._counter)
        return f"{self._prefix}{n & 0xFFFFFFFFFFFFFFFF:016X}"


class SendOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How a batch is routed and timed: the ``send`` request's own fields (protocol 4.1)."""

    queue_id: int | None = None
    sharding_key: str | None = None
    delay_ms: int | None = None
    deliver_at_ms: int | None = None
    delay_level: int | None = None
    wait_store: bool = True

    def fields(self) -> dict[str, Any]:
        """The request fields that differ from the engine's defaults."""
        fields: dict[str, Any] = {"wait_store": self.wait_store}
        optional = {"queue_id": self.queue_id, "sharding_key": self.sharding_key, "delay_ms": self.delay_ms,
                    "deliver_at_ms": self.deliver_at_ms, "delay_level": self.delay_level}
        fields.update({name: value for name, value in optional.items() if value is not None})
        return fields


def one_message(body: bytes, *, keys: Iterable[str], tags: str | None, properties: Mapping[str, str] | None,
                flag: int, born_timestamp: int | None) -> OutgoingMessage:
    return OutgoingMessage(body=body, keys=tuple(keys), tags=tags, properties=dict(properties or {}), flag=flag,
                           born_timestamp=born_timestamp)


def prepare_batch(messages: Iterable[OutgoingMessage | bytes],
                  uniq_keys: UniqKeys) -> tuple[list[dict[str, Any]], list[str | None]]:
    """The message maps of a send and the uniq key of each (the application's own if it set one)."""
    wire: list[dict[str, Any]] = []
    keys: list[str | None] = []
    for item in messages:
        message = item if isinstance(item, OutgoingMessage) else OutgoingMessage(body=item)
        key = message.properties.get(UNIQ_KEY) or uniq_keys.next()
        wire.append(outgoing_to_wire(message, key))
        keys.append(key)
    if not wire:
        raise ValueError("a batch needs at least one message")
    return wire, keys
