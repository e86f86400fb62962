"""``AsyncPopConsumer``: ``PopConsumer`` for asyncio.

    async with AsyncPopConsumer("workers", "jobs") as consumer:
        async for message in consumer:
            await handle(message)
            await consumer.ack(message)

Pops, acks and changes of invisible time of one consumer may be in flight together (on
one ``AsyncClient`` socket), so tasks may ack while another pops. Everything else is
``PopConsumer``'s (rmqpy/pop_consumer.py). Not thread-safe: use it from one event loop.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable

import msgspec

from engine.client import DEFAULT_ENDPOINT, EngineError
from engine.ipc.curve import CurveKeys
from rmqpy.aio.client import AsyncClient
from rmqpy.errors import ClientClosed, engine_error
from rmqpy.message import Message, message_from_wire
from rmqpy.pop_consumer import receipt
from rmqpy.retry import RetryPolicy, call_with_retry_async
from rmqpy.subscription import subscription_expression

__all__ = ["AsyncPopConsumer"]


class AsyncPopConsumer:
    def __init__(self, group: str, topic: str, *, endpoint: str = DEFAULT_ENDPOINT, client: AsyncClient | None = None,
                 subscription: str | Iterable[str] = "*", invisible_ms: int = 30_000, batch_size: int = 16,
                 max_wait_ms: int = 1_000, idle_timeout_ms: int | None = None, timeout_ms: int = 10_000,
                 retry: RetryPolicy | None = None, curve: CurveKeys | None = None) -> None:
        """As ``PopConsumer``; ``client``: share an ``AsyncClient`` (left open on close)."""
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
        self._own_client = client is None
        self.client = client or AsyncClient(endpoint, timeout_ms=timeout_ms, curve=curve)
        self._buffer: deque[Message] = deque()
        self._closed = False

    async def __aenter__(self) -> AsyncPopConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Give back the messages popped and not handed out, then close (an own client)."""
        if self._closed:
            return
        self._closed = True
        try:
            for message in self._buffer:
                await self.client.change_invisible_duration(self.group, receipt(message), 0)
        except EngineError:
            pass  # each comes back after its invisible time all the same
        finally:
            self._buffer.clear()
            if self._own_client:
                await self.client.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("the consumer is closed")

    async def pop(self, max_messages: int | None = None, *, timeout_ms: int | None = None,
                  invisible_ms: int | None = None, queue_id: int | None = None) -> list[Message]:
        """As ``PopConsumer.pop``: pops of at most ``max_wait_ms`` each until one brings messages."""
        self._check_open()
        deadline = time.monotonic() + (self.max_wait_ms if timeout_ms is None else timeout_ms) / 1000
        while True:
            wait_ms = max(0, min(self.max_wait_ms, int((deadline - time.monotonic()) * 1000)))
            pop = functools.partial(
                self.client.pop, self.group, self.topic, queue_id=queue_id,
                max_messages=max_messages or self.batch_size,
                invisible_ms=invisible_ms or self.invisible_ms, max_wait_ms=wait_ms, subscription=self.subscription)
            popped = await call_with_retry_async(self.retry, pop)
            if popped or time.monotonic() >= deadline:
                return [message_from_wire(m) for m in popped]

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Message]:
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
            self._buffer.extend(await self.pop(timeout_ms=wait_ms))

    async def ack(self, message: Message) -> None:
        """As ``PopConsumer.ack``."""
        refused = await self.ack_all([message])
        if refused:
            raise refused[0][1]

    async def ack_all(self, messages: Iterable[Message]) -> list[tuple[Message, EngineError]]:
        """As ``PopConsumer.ack_all``; the requests of different queues are in flight together."""
        self._check_open()
        by_handle = {m.receipt_handle: m for m in messages}
        receipts = [receipt(m) for m in by_handle.values()]
        failed = await call_with_retry_async(self.retry, lambda: self.client.ack(self.group, receipts))
        return [(by_handle[f["receipt_handle"]], engine_error({"error": f["error"]})) for f in failed]

    async def nack(self, message: Message) -> None:
        await self.change_invisible_duration(message, 0)

    async def change_invisible_duration(self, message: Message, invisible_ms: int) -> Message:
        """As ``PopConsumer.change_invisible_duration``."""
        self._check_open()
        handle = await call_with_retry_async(self.retry, lambda: self.client.change_invisible_duration(
            self.group, receipt(message), invisible_ms))
        return msgspec.structs.replace(message, receipt_handle=handle)

    async def dead_letter(self, message: Message) -> None:
        """As ``PopConsumer.dead_letter``."""
        self._check_open()
        failed = await call_with_retry_async(self.retry, lambda: self.client.ack(
            self.group, [receipt(message)], dead_letter=True))
        if failed:
            raise engine_error({"error": failed[0]["error"]})
