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

from engine.client import CONNECT_PROBE_MS, DEFAULT_ENDPOINT, ClientError, EngineUnreachable
from engine.ipc.curve import CurveKeys
from rmqpy._failover import Follow, NoMaster, Pause, Raise, SetSend, Wait, find_master, master_role
from rmqpy._send import SendOptions, UniqKeys, batch_fields, one_message
from rmqpy.aio.client import AsyncClient
from rmqpy.errors import ClientClosed
from rmqpy.message import OutgoingMessage, SendResult, send_results_from_wire
from rmqpy.retry import OnRetry, RetryPolicy

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
        one_engine = len(self.endpoints) == 1
        self._open: Callable[[str], AsyncClient] = lambda endpoint: AsyncClient(
            endpoint, timeout_ms=timeout_ms, in_flight_max=in_flight_max, context=context, curve=curve,
            watch_connection=not one_engine, unreachable_ms=CONNECT_PROBE_MS if one_engine else None)
        self.client = client or self._open(self.endpoints[0])
        self.timeout_ms = timeout_ms
        self._curve = curve
        self._looking: asyncio.Future[str | None] | None = None  # the look for the master under way
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
                                options: SendOptions, *, wait_for_master: bool = True) -> list[SendResult]:
        """The send all the others make: one request over the set's engines until its deadline, as
        ``Producer._send_now`` (``rmqpy/_failover.py``); many sends at once share one look for the master."""
        batch, uniq_keys = batch_fields(messages, self._uniq_keys, options)
        fields = {**options.fields(), **batch}
        way = SetSend(self.timeout_ms, self.retry, one_engine=len(self.endpoints) == 1 or not self._own_client)
        while True:
            client = self.client
            try:
                reply = await client.request("send", timeout_ms=way.remaining_ms(), topic=topic, **fields)
                return send_results_from_wire(topic, reply["results"], uniq_keys, reply.get("epoch", 0))
            except ClientClosed:
                if self.client is client:
                    raise
                continue  # another send moved this producer and closed the client this one waited on
            except ClientError as exc:
                step = way.after(exc, client.endpoint)
                if isinstance(exc, EngineUnreachable) and way.one_engine and self._own_client:
                    await self._replace(client)  # its socket may still hold the request: it must not go later
            if isinstance(step, Raise):
                raise step.error
            if isinstance(step, Wait):
                if step.pause_ms >= way.remaining_ms():
                    raise step.error
                await asyncio.sleep(step.pause_ms / 1000)  # the set's replicas follow its master again meanwhile
                continue
            if isinstance(step, Pause):
                if step.pause_ms >= way.remaining_ms():
                    raise step.error
                if self.on_retry is not None:
                    self.on_retry(step.error, step.retry, step.pause_ms)
                await asyncio.sleep(step.pause_ms / 1000)
                continue
            if self.client is not client:  # another send already moved this producer: go there
                continue
            master = step.master if isinstance(step, Follow) else None
            if master is not None and self._own_client and not await self._is_master(master):
                master = None  # the master named is gone: an election is under way
            if master is None and not way.one_engine:
                master = await self._look_for_master(client.endpoint, way, wait_for_master)
            if master is None or not self._own_client:
                raise way.failure()
            if self.client is client:
                await self._move_to(master)

    async def _look_for_master(self, failed: str, way: SetSend, wait_for_master: bool) -> str:
        """The set's master, asked of its engines in rounds until the send's deadline; the sends that
        fail together wait for one look (in a worker thread: the probes block)."""
        while True:
            if self._looking is None or self._looking.done():
                self._looking = asyncio.ensure_future(asyncio.to_thread(find_master, self.endpoints, failed,
                                                                        curve=self._curve))
            master = await asyncio.shield(self._looking)
            if master is not None:
                return master
            if not wait_for_master:
                raise NoMaster(self.endpoints, way.failure())
            pause_ms = way.look_pause_ms()
            if pause_ms >= way.remaining_ms():
                raise way.failure()
            await asyncio.sleep(pause_ms / 1000)

    async def _is_master(self, endpoint: str) -> bool:
        return await asyncio.to_thread(master_role, endpoint, curve=self._curve) is not None

    async def _move_to(self, endpoint: str) -> None:
        """An own client only: a shared one stays where its owner put it."""
        if endpoint == self.client.endpoint or not self._own_client:
            return
        old, self.client = self.client, self._open(endpoint)
        await old.close()

    async def _replace(self, client: AsyncClient) -> None:
        """A fresh client on the same engine (an own client only), once per failed client."""
        if self.client is client:
            self.client = self._open(client.endpoint)
            await client.close()
