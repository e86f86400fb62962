"""``AsyncPullConsumer``: ``PullConsumer`` for asyncio, every queue long-polled on one socket.

    async with AsyncPullConsumer("billing", "orders", subscription="paid") as consumer:
        async for message in consumer:
            await handle(message)

Offsets, commits, fairness, groups sharing queues and the meaning of every argument are
``PullConsumer``'s (rmqpy/pull_consumer.py says how it works); here each queue's pull is a
task of the event loop, and a ``poll`` waits for whichever finishes first. A member's
heartbeats have a thread of their own, as ``PullConsumer``'s. Not thread-safe: use it
from one event loop, and one task at a time.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Literal, TypeVar

from engine.client import DEFAULT_ENDPOINT, ClientError, EngineError, RequestTimeout
from engine.ipc.curve import CurveKeys
from rmqpy._group_member import GroupMember
from rmqpy._queue_book import QueueBook, assigned_queues, first_offset
from rmqpy.aio.client import AsyncClient
from rmqpy.errors import ClientClosed
from rmqpy.message import Message, messages_from_wire
from rmqpy.retry import RetryPolicy, call_with_retry_async
from rmqpy.subscription import EVERYTHING, subscription_expression

__all__ = ["AsyncPullConsumer"]

T = TypeVar("T")
log = logging.getLogger(__name__)
_REBALANCE_LOOK_S = 0.1  # a member waiting for messages looks this often whether its share changed


class AsyncPullConsumer:
    def __init__(self, group: str, topic: str, *, endpoint: str = DEFAULT_ENDPOINT, client: AsyncClient | None = None,
                 subscription: str | Iterable[str] = "*", queue_ids: Iterable[int] | None = None,
                 start_from: Literal["earliest", "latest"] = "earliest", auto_commit: bool = True,
                 commit_every: int = 100, batch_size: int = 32, max_wait_ms: int = 5_000,
                 idle_timeout_ms: int | None = None, timeout_ms: int = 10_000, retry: RetryPolicy | None = None,
                 curve: CurveKeys | None = None) -> None:
        """As ``PullConsumer``; ``client``: share an ``AsyncClient`` (left open on close).
        Nothing is sent before ``start()`` (``async with`` and the first ``poll`` call it)."""
        if min(commit_every, batch_size, max_wait_ms) < 1:
            raise ValueError("commit_every, batch_size and max_wait_ms must be >= 1")
        self.group = group
        self.topic = topic
        self.subscription = subscription_expression(subscription)
        self.auto_commit = auto_commit
        self.commit_every = commit_every
        self.batch_size = batch_size
        self.max_wait_ms = max_wait_ms
        self.idle_timeout_ms = idle_timeout_ms
        self.retry = retry or RetryPolicy()
        self._own_client = client is None
        self.client = client or AsyncClient(endpoint, timeout_ms=timeout_ms, curve=curve)
        self._queue_ids = None if queue_ids is None else list(queue_ids)
        self._start_from = start_from
        self._book: QueueBook | None = None
        self._member: GroupMember | None = None
        self._pulls: dict[asyncio.Task[dict[str, Any]], tuple[int, int]] = {}  # task -> (queue id, book token)
        self._closed = False

    async def __aenter__(self) -> AsyncPullConsumer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        await self.close(finish=exc_type is None)

    async def start(self) -> None:
        """Read the group's committed offsets (raises ``EngineError`` if the topic is missing)."""
        if self._book is not None:
            return
        refill_below = max(1, self.batch_size // 2)
        if self._queue_ids is None:
            self._member = await asyncio.to_thread(GroupMember, self.group, self.topic, endpoint=self.client.endpoint,
                                                   timeout_ms=self.client.timeout_ms, curve=self.client.curve)
            self._book = QueueBook({}, refill_below=refill_below)
            await self._rebalance(self._book)
            return
        topics = await call_with_retry_async(self.retry, self.client.list_topics)
        starts = {queue_id: await self._queue_start(queue_id)
                  for queue_id in assigned_queues(topics, self.topic, self._queue_ids)}
        self._book = QueueBook(starts, refill_below=refill_below)

    async def _queue_start(self, queue_id: int) -> tuple[int, int]:
        committed = await self._retrying(self.client.fetch_offset, self.group, self.topic, queue_id)
        if committed >= 0:
            return committed, committed
        stats = await self._retrying(self.client.queue_stats, self.topic, queue_id)
        return first_offset(stats, self._start_from), committed

    async def _rebalance(self, book: QueueBook) -> None:
        """As ``PullConsumer._rebalance``."""
        assert self._member is not None
        held = book.queue_ids
        share = self._member.share(held)
        if share is None:
            return
        hold, target = share
        for queue_id in sorted(set(held) - set(hold)):
            position, committed = book.drop(queue_id)
            if self.auto_commit and position != committed:
                try:
                    await self._retrying(self.client.commit_offset, self.group, self.topic, queue_id, position)
                except ClientError as exc:
                    log.warning("queue %d of %r left without its commit at %d: %s", queue_id, self.topic, position,
                                exc)
        self._member.reading(book.queue_ids)
        self._member.want(target)
        for queue_id in sorted(set(hold) - set(held)):
            book.add(queue_id, *await self._queue_start(queue_id))
        self._member.reading(book.queue_ids)
        if hold != held:
            log.info("group %r, topic %r: %s now reads queues %s", self.group, self.topic, self._member.client_id,
                     book.queue_ids)

    async def _retrying(self, call: Callable[..., Awaitable[T]], *args: Any) -> T:
        return await call_with_retry_async(self.retry, lambda: call(*args))

    async def close(self, *, finish: bool = True) -> None:
        """Commit (with ``auto_commit``) and close; ``finish`` as for ``PullConsumer.close``."""
        if self._closed:
            return
        self._closed = True
        for task in self._pulls:
            task.cancel()
        await asyncio.gather(*self._pulls, return_exceptions=True)
        self._pulls.clear()
        try:
            if self._book is not None:
                if finish:
                    self._book.finish()
                if self.auto_commit:
                    await self._commit(self._book)
        finally:
            if self._member is not None:
                await asyncio.to_thread(self._member.close)
            if self._own_client:
                await self.client.close()

    async def _opened(self) -> QueueBook:
        if self._closed:
            raise ClientClosed("the consumer is closed")
        await self.start()
        assert self._book is not None
        return self._book

    def positions(self) -> dict[int, int]:
        return {} if self._book is None else self._book.positions()

    # -- reading -----------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Message]:
        idle_since = time.monotonic()
        while not self._closed:
            if self.idle_timeout_ms is None:
                wait_ms = self.max_wait_ms
            else:
                wait_ms = max(0, int(self.idle_timeout_ms - (time.monotonic() - idle_since) * 1000))
            messages = await self.poll(wait_ms, max_messages=1)
            if messages:
                yield messages[0]
                idle_since = time.monotonic()
            elif self.idle_timeout_ms is not None and wait_ms == 0:
                return

    async def poll(self, timeout_ms: int | None = None, *, max_messages: int | None = None) -> list[Message]:
        """As ``PullConsumer.poll``."""
        book = await self._opened()
        book.finish()
        if self.auto_commit and book.finished_since_commit + book.skipped_since_commit >= self.commit_every:
            await self._commit(book)
        if self._member is not None and self._member.changed(time.monotonic()):
            await self._rebalance(book)
        deadline = time.monotonic() + (self.max_wait_ms if timeout_ms is None else timeout_ms) / 1000
        while True:
            self._send_pulls(book, time.monotonic())
            self._take_replies(book, {task for task in self._pulls if task.done()})  # each answered queue in turn
            taken = book.take(max_messages or self.batch_size)
            if taken:
                return taken
            now = time.monotonic()
            if now >= deadline:
                if self.auto_commit and book.skipped_since_commit:
                    await self._commit(book)  # no message to come would carry the group past what was filtered out
                return []
            wake = min(deadline, book.next_retry_at() or deadline)
            if self._member is not None:
                if self._member.changed(now):
                    await self._rebalance(book)  # nothing is in hand here: queues may come and go
                wake = min(wake, now + _REBALANCE_LOOK_S)
            if not self._pulls:
                await asyncio.sleep(wake - now)  # every queue waits out a retry's pause
                continue
            done, _ = await asyncio.wait(self._pulls, timeout=wake - now, return_when=asyncio.FIRST_COMPLETED)
            self._take_replies(book, done)

    def _send_pulls(self, book: QueueBook, now: float) -> None:
        for queue_id, offset, token in book.to_pull(now):
            # As PullConsumer._pull_wait_ms: with a tag subscription, wait at the engine only once caught up.
            wait_ms = self.max_wait_ms if self.subscription == EVERYTHING or book.caught_up(queue_id) else 0
            pull = self.client.pull(self.topic, queue_id, offset, max_messages=self.batch_size,
                                    max_wait_ms=wait_ms, subscription=self.subscription)
            self._pulls[asyncio.ensure_future(pull)] = (queue_id, token)

    def _take_replies(self, book: QueueBook, done: set[asyncio.Task[dict[str, Any]]]) -> None:
        refusal: BaseException | None = None
        for task in done:
            queue_id, token = self._pulls.pop(task)
            error = None if task.cancelled() else task.exception()
            if not task.cancelled() and error is None:
                reply = task.result()
                book.pulled(queue_id, token, messages_from_wire(reply["messages"]), reply["next_offset"])
                continue
            pause_ms = self.retry.backoff_ms(book.failures(queue_id) + 1, jitter=random.random())
            book.failed(queue_id, token, time.monotonic() + pause_ms / 1000)
            if error is None or isinstance(error, RequestTimeout) or (
                    isinstance(error, EngineError) and error.code in self.retry.retriable_codes):
                continue  # pulled again after the pause
            if isinstance(error, EngineError):
                error.details.setdefault("queue_id", queue_id)
            refusal = refusal or error
        if refusal is not None:
            raise refusal

    # -- offsets -----------------------------------------------------------

    async def commit(self) -> None:
        """As ``PullConsumer.commit``."""
        book = await self._opened()
        book.finish()
        await self._commit(book)

    async def _commit(self, book: QueueBook) -> None:
        for queue_id, offset in book.to_commit().items():
            await self._retrying(self.client.commit_offset, self.group, self.topic, queue_id, offset)
            book.committed(queue_id, offset)
        book.commit_done()

    def seek(self, queue_id: int, offset: int) -> None:
        """As ``PullConsumer.seek`` (after ``start()``)."""
        assert self._book is not None, "start() first"
        self._book.seek(queue_id, offset)
