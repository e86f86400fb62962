"""What the blocking and the asyncio producers share: uniq keys and the fields of a send.

The producer gives each message its ``UNIQ_KEY`` before sending it, as RocketMQ's
clients make the message id: the application learns the id from the ``SendResult``
even for a delayed message (whose record ids change on delivery), and a send retried
after a ``BUSY`` carries the same ids, so nothing can be told apart from the first try.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import msgspec

from engine import codec
from engine.client import EngineError
from engine.errors import ErrorCode
from rmqpy.message import OutgoingMessage, outgoing_to_wire

A = TypeVar("A")
B = TypeVar("B")


def mapped(future: concurrent.futures.Future[A], change: Callable[[A], B]) -> concurrent.futures.Future[B]:
    """A future that holds ``change(result)`` once ``future`` has its result, or its exception."""
    changed: concurrent.futures.Future[B] = concurrent.futures.Future()

    def done(finished: concurrent.futures.Future[A]) -> None:
        error = finished.exception()
        if error is not None:
            changed.set_exception(error)
        else:
            changed.set_result(change(finished.result()))

    future.add_done_callback(done)
    return changed


UNIQ_KEY = "UNIQ_KEY"


class UniqKeys:
    """32 uppercase hex characters, unique per producer: 8 random bytes, then a counter.

    The shape is the one the engine makes (docs/protocol.md 6.3); the random prefix
    (with the process id in it) keeps two producers apart, the counter keeps one
    producer's messages apart. Thread-safe: a lock guards the counter.
    """

    def __init__(self) -> None:
        prefix = (os.getpid() & 0xFFFF).to_bytes(2, "big") + os.urandom(6)
        self.prefix = prefix.hex().upper()
        self._counter = 0
        self._lock = threading.Lock()

    def claim(self, count: int) -> int:
        """The first of ``count`` consecutive counters, no one else's."""
        with self._lock:
            first, self._counter = self._counter, self._counter + count
        return first & 0xFFFFFFFFFFFFFFFF

    def next(self) -> str:
        return f"{self.prefix}{self.claim(1):016X}"


class SendOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How a batch is routed and timed: the ``send`` request's own fields (protocol 4.1)."""

    queue_id: int | None = None
    sharding_key: str | None = None
    delay_ms: int | None = None
    deliver_at_ms: int | None = None
    delay_level: int | None = None
    wait_store: bool = True

    @property
    def delayed(self) -> bool:
        return self.delay_ms is not None or self.deliver_at_ms is not None or self.delay_level is not None

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


def batch_fields(messages: Iterable[OutgoingMessage | bytes], uniq_keys: UniqKeys,
                 options: SendOptions) -> tuple[dict[str, Any], list[str | None]]:
    """The batch of a send request and the uniq key of each message.

    The batch goes as records this producer encodes (RocketMQ's MessageBatch body: the
    engine checks them and stores them without decoding a message map each), or as message
    maps when records cannot carry it: a delayed send, messages with different born
    timestamps, or a message the encoding refuses (the engine then says why).
    """
    batch = [item if isinstance(item, OutgoingMessage) else OutgoingMessage(body=item) for item in messages]
    if not batch:
        raise ValueError("a batch needs at least one message")
    born = {message.born_timestamp for message in batch}
    if not options.delayed and len(born) == 1:
        records, keys = codec.batch_records(batch, uniq_keys.prefix, uniq_keys.claim(len(batch)))
        if records is not None:
            assert isinstance(keys, list)
            fields: dict[str, Any] = {"records": records}
            [born_timestamp] = born
            if born_timestamp is not None:
                fields["born_timestamp"] = born_timestamp
            return fields, list[str | None](keys)
    wire, wire_keys = prepare_batch(batch, uniq_keys)
    return {"messages": wire}, wire_keys


def master_named(error: EngineError, endpoint: str) -> str | None:
    """The master's endpoint a ``NOT_MASTER`` refusal names, if it is another than ``endpoint``
    (the producer then sends there: a replica refuses every write, and stored nothing)."""
    master = error.details.get("master_endpoint") if error.code == ErrorCode.NOT_MASTER else None
    return master if isinstance(master, str) and master and master != endpoint else None
