"""A request past the protocol's frame limit is dropped by ZeroMQ at the engine without a reply
(docs/protocol.md 1.5): every Python client refuses it before sending, at once, with the code
the engine gives a body too large (MESSAGE_ILLEGAL), naming the limit."""

from __future__ import annotations

import asyncio
import time

import pytest

from engine.client import FRAME_BYTES_MAX, MESSAGE_BODY_BYTES_MAX, StoreClient
from rmqpy import EngineError, ErrorCode, Producer
from rmqpy.aio import AsyncClient, AsyncProducer

pytestmark = pytest.mark.timeout(30)

TOO_BIG = b"x" * 5_000_000
LIMIT_TEXT = f"{FRAME_BYTES_MAX:,} bytes"


def refused_at_once(error: EngineError, started: float) -> None:
    assert error.code == ErrorCode.MESSAGE_ILLEGAL and error.name == "MESSAGE_ILLEGAL"
    assert LIMIT_TEXT in error.message and f"{MESSAGE_BODY_BYTES_MAX:,}" in error.message
    assert time.monotonic() - started < 2.0, "refused before sending, not after the 10 s deadline"


def test_store_client_refuses_an_oversized_send_and_stays_usable(endpoint: str) -> None:
    with StoreClient(endpoint) as client:
        started = time.monotonic()
        with pytest.raises(EngineError) as info:
            client.send("orders", [{"body": TOO_BIG}])
        refused_at_once(info.value, started)
        half = b"x" * (FRAME_BYTES_MAX // 2)
        with pytest.raises(EngineError) as info:  # a batch that adds up past the limit
            client.send("orders", [{"body": half}, {"body": half}])
        assert info.value.code == ErrorCode.MESSAGE_ILLEGAL
        with pytest.raises(EngineError) as info:  # under the frame limit, over the body limit: the engine's word
            client.send("orders", [{"body": b"x" * (MESSAGE_BODY_BYTES_MAX + 1)}])
        assert info.value.code == ErrorCode.MESSAGE_ILLEGAL and LIMIT_TEXT not in info.value.message
        assert client.ping()


def test_the_typed_producer_refuses_an_oversized_body(endpoint: str) -> None:
    with Producer(endpoint) as producer:
        started = time.monotonic()
        with pytest.raises(EngineError) as info:
            producer.send("orders", TOO_BIG)
        refused_at_once(info.value, started)
        assert producer.send("orders", b"small").msg_id


def test_the_asyncio_clients_refuse_an_oversized_body(endpoint: str) -> None:
    async def main() -> None:
        async with AsyncProducer(endpoint) as producer:
            started = time.monotonic()
            with pytest.raises(EngineError) as info:
                await producer.send("orders", TOO_BIG)
            refused_at_once(info.value, started)
            assert (await producer.send("orders", b"small")).msg_id
        async with AsyncClient(endpoint) as client:
            started = time.monotonic()
            with pytest.raises(EngineError) as info:
                await client.send("orders", [{"body": TOO_BIG}])
            refused_at_once(info.value, started)
            assert await client.ping()

    asyncio.run(main())
