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

A worker of a cluster of broker sets is a class of its own, ``ClusterPopConsumer`` (below): a
``PopConsumer`` per set, popped in turn; ``PopConsumer(..., cluster=...)`` returns one.

Not thread-safe: give each worker thread its own ``PopConsumer``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec
import zmq

from engine.client import DEFAULT_ENDPOINT, ClientError, EngineError, StoreClient
from engine.errors import ErrorCode
from engine.ipc.curve import CurveKeys
from rmqpy.cluster import Cluster, SetReaders, opened
from rmqpy.errors import ClientClosed, engine_error
from rmqpy.message import Message, message_from_wire
from rmqpy.retry import RetryPolicy, call_with_retry
from rmqpy.subscription import subscription_expression

__all__ = ["ClusterPopConsumer", "PopConsumer", "receipt"]

log = logging.getLogger(__name__)


def receipt(message: Message) -> dict[str, Any]:
    """What an ack or a change of invisible time names: the message's queue and receipt handle."""
    if message.receipt_handle is None:
        raise ValueError(f"message {message.msg_id} was not popped: it has no receipt handle")
    return {"topic": message.topic, "queue_id": message.queue_id, "receipt_handle": message.receipt_handle}


class PopConsumer:
    def __new__(cls, group: str, topic: str, *, cluster: Cluster | str | None = None, **options: Any) -> Any:
        """Given ``cluster``, a ``ClusterPopConsumer`` with these options, not a ``PopConsumer``
        (typed ``Any`` as ``Producer.__new__`` is, for the same reason)."""
        if cluster is not None:
            return ClusterPopConsumer(cluster, group, topic, **options)
        return super().__new__(cls)

    def __init__(self, group: str, topic: str, *, endpoint: str = DEFAULT_ENDPOINT,
                 subscription: str | Iterable[str] = "*", invisible_ms: int = 30_000, batch_size: int = 16,
                 max_wait_ms: int = 1_000, idle_timeout_ms: int | None = None, timeout_ms: int = 10_000,
                 retry: RetryPolicy | None = None, context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 curve: CurveKeys | None = None, cluster: Cluster | str | None = None) -> None:
        """``invisible_ms``: how long a popped message stays hidden from the group's other pops.
        ``max_wait_ms``: how long one pop waits at the engine for a message (see "Waiting").
        ``idle_timeout_ms``: the iteration ends after this long without a message (None: never).
        ``cluster``: a cluster of broker sets (as for ``PullConsumer``) instead of ``endpoint``: pops
        take from every set serving the topic in turn; acks go to the set that stored the message.
        The rest as for ``PullConsumer``. ``__new__`` answers ``cluster`` with a ``ClusterPopConsumer``:
        this class is one set's."""
        assert cluster is None, "PopConsumer.__new__ made a ClusterPopConsumer"
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
                self._client.change_invisible_duration(self.group, receipt(message), 0)
        except EngineError:
            pass  # each comes back after its invisible time all the same
        finally:
            self._buffer.clear()
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
        return _one_by_one(self)

    def ack(self, message: Message) -> None:
        """The message is done for the group. Raises ``EngineError`` ``INVALID_RECEIPT_HANDLE`` when
        its handle is stale: it was delivered again (its invisible time passed) or changed since."""
        refused = self.ack_all([message])
        if refused:
            raise refused[0][1]

    def ack_all(self, messages: Iterable[Message]) -> list[tuple[Message, EngineError]]:
        """Acknowledge many messages (one request per queue); returns those refused, with why."""
        self._check_open()
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
        call = functools.partial(self._client.change_invisible_duration, self.group, receipt(message), invisible_ms)
        return msgspec.structs.replace(message, receipt_handle=call_with_retry(self.retry, call))

    def dead_letter(self, message: Message) -> None:
        """Give up on the message: it goes to ``%DLQ%<group>`` now, whatever its attempt."""
        self._check_open()
        failed = call_with_retry(self.retry, functools.partial(self._client.dead_letter, self.group,
                                                               [receipt(message)]))
        if failed:
            raise engine_error({"error": failed[0]["error"]})


class ClusterPopConsumer:
    """A worker of pop group ``group`` on every broker set serving ``topic`` (docs/cluster.md,
    "Clients"): a ``PopConsumer`` per set; ``pop`` takes from the sets in turn, ``ack``/``nack`` go to
    the set that stored the message (by its ``store_host``). Options are ``PopConsumer``'s (but
    ``endpoint``); iteration and closing as ``PopConsumer``'s."""

    def __init__(self, cluster: Cluster | str, group: str, topic: str, *, batch_size: int = 16,
                 max_wait_ms: int = 1_000, idle_timeout_ms: int | None = None, **consumer_options: Any) -> None:
        if "endpoint" in consumer_options:
            raise ValueError("a consumer on a cluster pops from every set: endpoint is a single set's")
        self.cluster, self._owns_cluster = opened(cluster)
        self.batch_size = batch_size
        self.max_wait_ms = max_wait_ms
        self.idle_timeout_ms = idle_timeout_ms
        self._sets = SetReaders(self.cluster, topic, lambda endpoint: PopConsumer(
            group, topic, endpoint=endpoint, batch_size=batch_size, max_wait_ms=max_wait_ms, **consumer_options),
            PopConsumer.close)
        self._stored_by: dict[str, str] = {}  # a message's store_host -> the broker set that stored it
        self._buffer: deque[Message] = deque()  # popped, not handed out yet (iteration)
        self._turn = 0
        self._closed = False
        try:
            self._sets.follow(fresh=False)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ClusterPopConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Give back the messages popped and not handed out, each at its set; then close every set's."""
        if self._closed:
            return
        try:
            for message in self._buffer:
                self.nack(message)
        except EngineError:
            pass  # each comes back after its invisible time all the same
        finally:
            self._closed = True
            self._buffer.clear()
            for consumer in self._sets.consumers():
                consumer.close()
            self._sets.readers.clear()
            if self._owns_cluster:
                self.cluster.close()

    def __iter__(self) -> Iterator[Message]:
        return _one_by_one(self)

    def pop(self, max_messages: int | None = None, *, timeout_ms: int | None = None,
            invisible_ms: int | None = None, queue_id: int | None = None) -> list[Message]:
        """Up to ``max_messages`` from one set (each set in turn), waiting up to ``timeout_ms`` (default
        ``max_wait_ms``) for the first: each set's pop waits its share of it."""
        self._check_open()
        if queue_id is not None:
            raise ValueError("a consumer on a cluster pops from every set: queue_id is a single set's")
        if self._sets.due():
            self._sets.follow(fresh=True)
        deadline = time.monotonic() + (self.max_wait_ms if timeout_ms is None else timeout_ms) / 1000
        while True:
            sets = self._sets.in_turn(self._turn)
            if not sets:
                return []
            broker, consumer = sets[0]
            self._turn += 1
            share_ms = max(0, int((deadline - time.monotonic()) * 1000 / len(sets)))
            try:
                popped = consumer.pop(max_messages, timeout_ms=share_ms, invisible_ms=invisible_ms)
            except ClientError as exc:
                log.warning("broker set %r: %s (its route is read again)", broker, exc)
                self._sets.follow(fresh=True)
                popped = []
            for message in popped:
                self._stored_by[message.store_host] = broker
            if popped or time.monotonic() >= deadline:
                return popped

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("the consumer is closed")

    def _owner(self, message: Message) -> PopConsumer:
        self._check_open()
        broker = self._stored_by.get(message.store_host)
        if broker is None or broker not in self._sets.readers:
            raise EngineError(ErrorCode.INVALID_RECEIPT_HANDLE, ErrorCode.INVALID_RECEIPT_HANDLE.name,
                              f"message {message.msg_id} was not popped from a broker set this consumer reads")
        return self._sets.readers[broker][1]

    def ack(self, message: Message) -> None:
        self._owner(message).ack(message)

    def ack_all(self, messages: Iterable[Message]) -> list[tuple[Message, EngineError]]:
        """One ``ack_all`` per set that stored some of ``messages``; the refused ones, with why."""
        by_set: dict[int, tuple[PopConsumer, list[Message]]] = {}
        for message in messages:
            owner = self._owner(message)
            by_set.setdefault(id(owner), (owner, []))[1].append(message)
        return [refused for owner, mine in by_set.values() for refused in owner.ack_all(mine)]

    def nack(self, message: Message) -> None:
        self._owner(message).nack(message)

    def change_invisible_duration(self, message: Message, invisible_ms: int) -> Message:
        return self._owner(message).change_invisible_duration(message, invisible_ms)

    def dead_letter(self, message: Message) -> None:
        self._owner(message).dead_letter(message)


def _one_by_one(consumer: PopConsumer | ClusterPopConsumer) -> Iterator[Message]:
    """Popped messages one by one (``__iter__`` of both): ``batch_size`` at a pop, kept in the
    consumer's buffer (given back when it closes); ends after ``idle_timeout_ms`` without any, or on close."""
    idle_since = time.monotonic()
    while not consumer._closed:
        if consumer._buffer:
            yield consumer._buffer.popleft()
            idle_since = time.monotonic()
            continue
        if consumer.idle_timeout_ms is None:
            wait_ms = consumer.max_wait_ms
        else:
            wait_ms = int(consumer.idle_timeout_ms - (time.monotonic() - idle_since) * 1000)
            if wait_ms <= 0:
                return
        consumer._buffer.extend(consumer.pop(timeout_ms=wait_ms))
