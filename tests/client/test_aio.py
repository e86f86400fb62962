"""The asyncio client on a live engine: many requests in flight on one socket, replies out
of order, the async producer, the async consumer group, and the async pop consumer."""

from __future__ import annotations

import asyncio
import time

import pytest

from rmqpy import EngineError, ErrorCode, Message, RequestTimeout
from rmqpy.aio import AsyncClient, AsyncPopConsumer, AsyncProducer, AsyncPullConsumer
from supervisor.launcher import EngineProcess
from tests.helpers import wait_dispatched

pytestmark = pytest.mark.timeout(60)


def test_a_reply_overtakes_a_parked_pull_on_the_same_socket(endpoint: str) -> None:
    async def main() -> None:
        async with AsyncClient(endpoint) as client:
            parked = asyncio.ensure_future(client.pull("jobs", 0, 0, max_wait_ms=20_000))
            assert await client.ping(), "answered while the pull waits at the engine"
            [result] = await client.send("jobs", [{"body": b"wake up"}], queue_id=0)
            reply = await asyncio.wait_for(parked, 10)
            assert reply["messages"][0]["msg_id"] == result["msg_id"]
            with pytest.raises(EngineError) as info:
                await client.send("jobs", [{"body": b""}])
            assert info.value.code == ErrorCode.MESSAGE_ILLEGAL
            with pytest.raises(RequestTimeout):  # the engine holds it 5 s; the client gives up after 0.3 s
                await client.request("pull", timeout_ms=300, topic="jobs", queue_id=1, offset=0, max_wait_ms=5_000)
            assert await client.ping(), "a timed-out request leaves the socket usable"

    asyncio.run(main())


def test_many_sends_in_flight_on_one_socket_are_all_stored_once(endpoint: str) -> None:
    count = 1_000

    async def main() -> list[Message]:
        async with AsyncClient(endpoint, in_flight_max=128) as client:
            producer = AsyncProducer(client=client)
            sends = [asyncio.ensure_future(producer.send("orders", b"%d" % n, keys=[f"k{n}"])) for n in range(count)]
            await asyncio.sleep(0)  # one turn of the loop: each send runs until it waits for its reply
            most_in_flight = client.in_flight
            results = await asyncio.gather(*sends)
            assert most_in_flight > 1, "the sends were not in flight together"
            assert len({(r.queue_id, r.queue_offset) for r in results}) == count
            received: list[Message] = []
            async with AsyncPullConsumer("all", "orders", client=client, idle_timeout_ms=1_500) as consumer:
                async for message in consumer:
                    received.append(message)
            assert client.in_flight == 0
            return received

    received = asyncio.run(main())
    assert sorted(int(m.body) for m in received) == list(range(count))


def test_the_async_group_commits_and_a_restart_resumes_where_it_committed(endpoint: str) -> None:
    async def main() -> tuple[list[bytes], list[bytes]]:
        async with AsyncProducer(endpoint) as producer:
            for queue_id in range(4):
                await producer.send_batch("orders", [b"q%d-%d" % (queue_id, n) for n in range(25)], queue_id=queue_id)
        first: list[bytes] = []
        async with AsyncPullConsumer("billing", "orders", endpoint=endpoint, commit_every=7) as consumer:
            deadline = time.monotonic() + 20
            async for message in consumer:
                first.append(message.body)
                if len(first) == 60:
                    break
                assert time.monotonic() < deadline
        async with AsyncPullConsumer("billing", "orders", endpoint=endpoint, idle_timeout_ms=1_000) as consumer:
            rest = [m.body async for m in consumer]
            assert consumer.positions() == {0: 25, 1: 25, 2: 25, 3: 25}
        return first, rest

    first, rest = asyncio.run(main())
    assert len(first) == 60
    assert sorted(first + rest) == sorted(b"q%d-%d" % (q, n) for q in range(4) for n in range(25))


def test_the_async_group_with_a_tag_subscription_commits_past_what_it_filtered_out(engine: EngineProcess,
                                                                                   endpoint: str) -> None:
    with engine.client() as store:
        store.send("jobs", [{"body": b"paid-%d" % n, "tags": "paid"} for n in range(10)]
                   + [{"body": b"shipped-%d" % n, "tags": "shipped"} for n in range(40)], queue_id=0)
        store.send("jobs", [{"body": b"shipped", "tags": "shipped"}] * 5, queue_id=1)
        wait_dispatched(store)

    async def main() -> tuple[list[bytes], dict[int, int], list[int]]:
        async with AsyncClient(endpoint) as client, AsyncPullConsumer(
                "billing", "jobs", client=client, subscription="paid", batch_size=8, idle_timeout_ms=1_000) as consumer:
            got = [m.body async for m in consumer]
            positions = consumer.positions()
            committed = [await client.fetch_offset("billing", "jobs", queue_id) for queue_id in (0, 1)]
        return got, positions, committed

    got, positions, committed_while_idle = asyncio.run(main())
    assert got == [b"paid-%d" % n for n in range(10)]
    assert positions == {0: 50, 1: 5}, "the position moves past every filtered-out message"
    assert committed_while_idle == [50, 5], "committed once idle, not only at close"
    with engine.client() as store:
        assert store.consumer_lag("billing", "jobs") == {0: 0, 1: 0}


def test_two_async_members_of_a_group_share_the_queues_and_read_everything_once(endpoint: str) -> None:
    expected = sorted(b"q%d-%d" % (q, n) for q in range(4) for n in range(10))

    async def main() -> tuple[list[int], list[int], list[bytes]]:
        read: list[bytes] = []
        async with AsyncPullConsumer("sharing", "orders", endpoint=endpoint) as first, \
                AsyncPullConsumer("sharing", "orders", endpoint=endpoint) as second:
            deadline = time.monotonic() + 20
            while len(first.positions()) != 2 or len(second.positions()) != 2:  # the first lets half go
                assert await first.poll(50) == [] and await second.poll(50) == []
                assert time.monotonic() < deadline, (first.positions(), second.positions())
            shares = sorted(first.positions()), sorted(second.positions())
            async with AsyncProducer(endpoint) as producer:
                for queue_id in range(4):
                    await producer.send_batch("orders", [b"q%d-%d" % (queue_id, n) for n in range(10)],
                                              queue_id=queue_id)
            while len(read) < len(expected):
                read += [m.body for consumer in (first, second) for m in await consumer.poll(50)]
                assert time.monotonic() < deadline
        return *shares, read

    first, second, read = asyncio.run(main())
    assert sorted(first + second) == [0, 1, 2, 3]
    assert sorted(read) == expected, "each message read once"


def test_the_async_pop_consumer_acks_and_redelivers_a_nacked_message(endpoint: str) -> None:
    async def main() -> None:
        async with AsyncProducer(endpoint) as producer:
            await producer.send_batch("jobs", [b"a", b"b"], queue_id=0)
        async with AsyncPopConsumer("workers", "jobs", endpoint=endpoint, idle_timeout_ms=3_000) as consumer:
            seen: list[tuple[bytes, int | None]] = []
            async for message in consumer:
                seen.append((message.body, message.attempt))
                if message.body == b"b" and message.attempt == 1:
                    await consumer.nack(message)
                else:
                    await consumer.ack(message)
                if len(seen) == 3:
                    break
        assert seen == [(b"a", 1), (b"b", 1), (b"b", 2)]

    asyncio.run(main())
