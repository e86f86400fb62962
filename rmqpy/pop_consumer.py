"""``PopConsumer``: a worker of a pop group, taking messages and acknowledging each one.

    with PopConsumer("workers", "jobs", invisible_ms=60_000) as consumer:
        for message in consumer:
            if handle(message):
                consumer.ack(message)        # done for the whole group
            else:
                consumer.nack(message)       # back now, attempt + 1

A popped message is invisible to the group's other workers for ``invisible_ms``. An ack
ends it; without one (or after a nack) it comes back with ``attempt`` + 1, and after 16
deliveries it goes to the dead-letter topic ``%DLQ%<group>`` (docs/protocol.md 4.12).
Any number of workers, in as many processes as you like, may pop one group: the engine
shares the messages out, and picks the queues.

Waiting. A pop that finds nothing waits at the engine for a message (long polling), but
it watches only the queues of one engine process: the engine takes its processes in
turn, one per pop. So the consumer waits in pops of at most ``max_wait_ms`` (1 s by
default), each at the next process, and a message on any queue is taken within about
that time even when one consumer watches a topic alone.

Iteration pops ``batch_size`` messages at a time and hands them out one by one; each
one's invisible time runs from the pop, so keep ``batch_size`` times the work per message
well under ``invisible_ms``, or extend a message with ``change_invisible_duration``.
Messages popped but not handed out when the consumer closes are given back at once.

Not thread-safe: give each worker thread its own ``PopConsumer``.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import msgspec
import zmq

from engine.client import DEFAULT_ENDPOINT, EngineError, StoreClient
from engine.ipc.curve import CurveKeys
from rmqpy.errors import ClientClosed, engine_error
from rmqpy.message import Message, message_from_wire
from rmqpy.retry import RetryPolicy, call_with_retry
from rmqpy.subscription import subscription_expression

if TYPE_CHECKING:
    from rmqpy.cluster import Cluster, ClusterPopConsumer

__all__ = ["PopConsumer", "receipt"]


def receipt(message: Message) -> dict[str, Any]:
    """What an ack or a change of invisible time names: the message's queue and receipt handle."""
    if message.receipt_handle is None:
        raise ValueError(f"message {message.msg_id} was not popped: it has no receipt handle")
    return {"topic": message.topic, "queue_id": message.queue_id, "receipt_handle": message.receipt_handle}


class PopConsumer:
    def __init__(self, group: str, topic: str, *, endpoint: str = DEFAULT_ENDPOINT,
                 subscription: str | Iterable[str] = "*", invisible_ms: int = 30_000, batch_size: int = 16,
                 max_wait_ms: int = 1_000, idle_timeout_ms: int | None = None, timeout_ms: int = 10_000,
                 retry: RetryPolicy | None = None, context: zmq.Context | None = None,
                 curve: CurveKeys | None = None, cluster: Cluster | str | None = None) -> None:
        """``invisible_ms``: how long a popped message stays hidden from the group's other pops.
        ``max_wait_ms``: how long one pop waits at the engine for a message (see "Waiting").
        ``idle_timeout_ms``: the iteration ends after this long without a message (None: never).
        ``cluster``: a cluster of broker sets (as for ``PullConsumer``) instead of ``endpoint``: pops
        take from every set serving the topic in turn; acks go to the set that stored the message.
        The rest as for ``PullConsumer``."""
        if min(batch_size, max_wait_ms, invisible_ms) < 1:
            raise ValueError("batch_size, max_wait_ms and invisible_ms must be >= 1")
        self.group = group
        self.topic = topic
        self.subscription = subscription_expression(subscription)
        self.invisible_ms = invisible_ms
        self.batch_size = batch_size
        self.max_wait_ms = max_wait_ms
        self.idle_timeout_ms = idle_timeout_ms
        self.retry = retry or RetryPolicy()
        self._buffer: deque[Message] = deque()  # popped, not handed out yet
        self._closed = False
        self._spread: ClusterPopConsumer | None = None
        if cluster is not None:
            from rmqpy.cluster import ClusterPopConsumer  # it builds on this class

            self._spread = ClusterPopConsumer(cluster, group, topic, max_wait_ms=max_wait_ms,
                                              subscription=subscription, invisible_ms=invisible_ms,
                                              batch_size=batch_size, timeout_ms=timeout_ms, retry=retry,
                                              context=context, curve=curve)
            return
        self._client = StoreClient(endpoint, timeout_ms=timeout_ms, context=context, curve=curve)

    def __enter__(self) -> PopConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Give back the messages popped and not handed out, then close the socket."""
        if self._closed:
            return
        self._closed = True
        try:
            for message in self._buffer:
                if self._spread is not None:
                    self._spread.nack(message)  # at the set that stored it
                else:
                    self._client.change_invisible_duration(self.group, receipt(message), 0)
        except EngineError:
            pass  # each comes back after its invisible time all the same
        finally:
            self._buffer.clear()
            if self._spread is not None:
                self._spread.close()
            else:
                self._client.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("the consumer is closed")

    def pop(self, max_messages: int | None = None, *, timeout_ms: int | None = None,
            invisible_ms: int | None = None, queue_id: int | None = None) -> list[Message]:
        """Take up to ``max_messages`` (default ``batch_size``) messages, waiting up to ``timeout_ms``
        (default ``max_wait_ms``) for the first; [] if none came. Each carries its
        ``receipt_handle`` and ``attempt``. ``queue_id``: from that queue only."""
        self._check_open()
        if self._spread is not None:
            if queue_id is not None:
                raise ValueError("a consumer on a cluster pops from every set: queue_id is a single set's")
            return self._spread.pop(max_messages, timeout_ms=timeout_ms, invisible_ms=invisible_ms)
        deadline = time.monotonic() + (self.max_wait_ms if timeout_ms is None else timeout_ms) / 1000
        while True:
            wait_ms = max(0, min(self.max_wait_ms, int((deadline - time.monotonic()) * 1000)))
            call = functools.partial(
                self._client.pop, self.group, self.topic, queue_id=queue_id,
                max_messages=max_messages or self.batch_size,
                invisible_ms=invisible_ms or self.invisible_ms, subscription=self.subscription, max_wait_ms=wait_ms)
            popped = call_with_retry(self.retry, call)
            if popped or time.monotonic() >= deadline:
                return [message_from_wire(m) for m in popped]

    def __iter__(self) -> Iterator[Message]:
        """Popped messages one by one; ends after ``idle_timeout_ms`` without any, or on close."""
        idle_since = time.monotonic()
        while not self._closed:
            if self._buffer:
                yield self._buffer.popleft()
                idle_since = time.monotonic()
                continue
            if self.idle_timeout_ms is None:
                wait_ms = self.max_wait_ms
            else:
                wait_ms = int(self.idle_timeout_ms - (time.monotonic() - idle_since) * 1000)
                if wait_ms <= 0:
                    return
            self._buffer.extend(self.pop(timeout_ms=wait_ms))

    def ack(self, message: Message) -> None:
        """The message is done for the group. Raises ``EngineError`` ``INVALID_RECEIPT_HANDLE`` when
        its handle is stale: it was delivered again (its invisible time passed) or changed since."""
        refused = self.ack_all([message])
        if refused:
            raise refused[0][1]

    def ack_all(self, messages: Iterable[Message]) -> list[tuple[Message, EngineError]]:
        """Acknowledge many messages (one request per queue); returns those refused, with why."""
        self._check_open()
        if self._spread is not None:
            return self._spread.ack_all(messages)
        by_handle = {m.receipt_handle: m for m in messages}
        receipts = [receipt(m) for m in by_handle.values()]
        failed = call_with_retry(self.retry, functools.partial(self._client.ack, self.group, receipts))
        return [(by_handle[f["receipt_handle"]], engine_error({"error": f["error"]})) for f in failed]

    def nack(self, message: Message) -> None:
        """Give the message back now: it is delivered again, with ``attempt`` + 1."""
        self.change_invisible_duration(message, 0)

    def change_invisible_duration(self, message: Message, invisible_ms: int) -> Message:
        """Hide the message for ``invisible_ms`` from now; returns it with its new receipt handle
        (the old one is stale from now on)."""
        self._check_open()
        if self._spread is not None:
            return self._spread.change_invisible_duration(message, invisible_ms)
        call = functools.partial(self._client.change_invisible_duration, self.group, receipt(message), invisible_ms)
        return msgspec.structs.replace(message, receipt_handle=call_with_retry(self.retry, call))

    def dead_letter(self, message: Message) -> None:
        """Give up on the message: it goes to ``%DLQ%<group>`` now, whatever its attempt."""
        self._check_open()
        if self._spread is not None:
            self._spread.dead_letter(message)
            return
        failed = call_with_retry(self.retry, functools.partial(self._client.dead_letter, self.group,
                                                               [receipt(message)]))
        if failed:
            raise engine_error({"error": failed[0]["error"]})
