"""``AsyncProducer``: the typed producer for asyncio, many sends in flight on one socket.

    async with AsyncProducer("tcp://127.0.0.1:10911") as producer:
        results = await asyncio.gather(*(producer.send("orders", b"%d" % i) for i in range(1_000)))

It is what ``Producer`` is (same methods, same results, same retries), with coroutines.
Not thread-safe: use it from one event loop; any number of its tasks may send at once.
From other threads, use ``Producer.send_async``, which runs one of these on a thread of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

import zmq.asyncio

from engine.client import DEFAULT_ENDPOINT, EngineError, EngineUnreachable, RequestTimeout, engine_answers
from engine.errors import ErrorCode
from engine.ipc.curve import CurveKeys
from rmqpy._send import (
    FOLLOW_PROBE_MS,
    SendOptions,
    UniqKeys,
    batch_fields,
    endpoints_after,
    master_named,
    one_message,
)
from rmqpy.aio.client import AsyncClient
from rmqpy.message import OutgoingMessage, SendResult, send_results_from_wire
from rmqpy.retry import OnRetry, RetryPolicy, call_with_retry_async

__all__ = ["AsyncProducer"]


class AsyncProducer:
    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, *, client: AsyncClient | None = None,
                 timeout_ms: int = 10_000, retry: RetryPolicy | None = None, on_retry: OnRetry | None = None,
                 wait_store: bool = True, in_flight_max: int = 256, context: zmq.asyncio.Context | None = None,
                 curve: CurveKeys | None = None) -> None:
        """``client``: share an ``AsyncClient`` (and its socket) with other producers and consumers;
        it stays open when the producer closes. Otherwise the producer opens its own, and follows
        the master of a broker set as ``Producer`` does (``endpoint`` may name all its engines).
        The other arguments are ``Producer``'s."""
        self._own_client = client is None
        self.endpoints = [part.strip() for part in endpoint.split(",") if part.strip()]
        self._open: Callable[[str], AsyncClient] = lambda endpoint: AsyncClient(
            endpoint, timeout_ms=timeout_ms, in_flight_max=in_flight_max, context=context, curve=curve,
            watch_connection=len(self.endpoints) > 1)
        self.client = client or self._open(self.endpoints[0])
        self.retry = retry or RetryPolicy()
        self.on_retry = on_retry
        self.wait_store = wait_store
        self._uniq_keys = UniqKeys()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_client:
            await self.client.close()

    async def send(self, topic: str, body: bytes, *, keys: Iterable[str] = (), tags: str | None = None,
                   properties: Mapping[str, str] | None = None, flag: int = 0, born_timestamp: int | None = None,
                   queue_id: int | None = None, sharding_key: str | None = None, delay_ms: int | None = None,
                   deliver_at_ms: int | None = None, delay_level: int | None = None) -> SendResult:
        """Store one message; see ``Producer.send``."""
        message = one_message(body, keys=keys, tags=tags, properties=properties, flag=flag,
                              born_timestamp=born_timestamp)
        options = SendOptions(queue_id=queue_id, sharding_key=sharding_key, delay_ms=delay_ms,
                              deliver_at_ms=deliver_at_ms, delay_level=delay_level, wait_store=self.wait_store)
        [result] = await self.send_with_options(topic, [message], options)
        return result

    async def send_batch(self, topic: str, messages: Iterable[OutgoingMessage | bytes], *,
                         queue_id: int | None = None, sharding_key: str | None = None, delay_ms: int | None = None,
                         deliver_at_ms: int | None = None, delay_level: int | None = None) -> list[SendResult]:
        """Store messages in one queue, all or nothing; see ``Producer.send_batch``."""
        options = SendOptions(queue_id=queue_id, sharding_key=sharding_key, delay_ms=delay_ms,
                              deliver_at_ms=deliver_at_ms, delay_level=delay_level, wait_store=self.wait_store)
        return await self.send_with_options(topic, messages, options)

    async def send_with_options(self, topic: str, messages: Iterable[OutgoingMessage | bytes],
                                options: SendOptions) -> list[SendResult]:
        """The send all the others make: one request, retried as ``retry`` says."""
        batch, uniq_keys = batch_fields(messages, self._uniq_keys, options)
        fields = {**options.fields(), **batch}

        async def attempt() -> list[SendResult]:
            try:
                results = (await self.client.request("send", topic=topic, **fields))["results"]
            except EngineError as exc:  # a replica names its master: an own client goes there
                master = master_named(exc, self.client.endpoint)
                if master is not None and self._own_client and not await _answers(master):
                    master = None  # the master it names is gone: an election is under way
                if master is None and exc.code == ErrorCode.NOT_MASTER:  # nobody named: an election
                    await self._move_to(await self._next_endpoint())
                if master is None or not self._own_client:
                    raise
                await self._move_to(master)
                results = (await self.client.request("send", topic=topic, **fields))["results"]
            except (RequestTimeout, EngineUnreachable):  # maybe a master gone: the next request elsewhere
                await self._move_to(await self._next_endpoint())
                raise
            return send_results_from_wire(topic, results, uniq_keys)

        return await call_with_retry_async(self.retry, attempt, on_retry=self.on_retry)

    async def _next_endpoint(self) -> str:
        """The engine of the set after the current one that accepts a connection (``Producer``'s)."""
        following = endpoints_after(self.endpoints, self.client.endpoint)
        if len(following) > 1:
            for endpoint in following:
                if await _answers(endpoint):
                    return endpoint
        return following[0]

    async def _move_to(self, endpoint: str) -> None:
        """An own client only: a shared one stays where its owner put it."""
        if endpoint == self.client.endpoint or not self._own_client:
            return
        await self.client.close()
        self.client = self._open(endpoint)


async def _answers(endpoint: str) -> bool:
    """``engine_answers`` in a worker thread: the probe blocks (at most ``FOLLOW_PROBE_MS``)."""
    return await asyncio.to_thread(engine_answers, endpoint, timeout_ms=FOLLOW_PROBE_MS)
