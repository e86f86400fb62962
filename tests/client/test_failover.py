"""A producer on a broker set's address moves on as soon as its engine fails (rmqpy/_failover.py), never
at its deadline: an engine whose connection is refused (killed), and one that answers no heartbeat
(paused: its connection stays up). A producer on one engine where nothing listens says so within
``CONNECT_PROBE_MS``. Here the set's engines are standalone engines, each its own master (each
answers ``route`` as master): what is tested is the client's move, not an election
(tests/replication/test_client_failover.py has the elections).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from engine.client import CONNECT_PROBE_MS, HEARTBEAT_TIMEOUT_MS, EngineUnreachable
from engine.config import StoreConfig
from rmqpy import Producer
from rmqpy.aio import AsyncProducer
from supervisor.launcher import EngineProcess, free_port
from tests.helpers import engine_with_topics

pytestmark = pytest.mark.timeout(120)
TIMEOUT_MS = 10_000  # the request deadline a stalled producer would wait out


@pytest.fixture
def two_engines(tmp_path: Path) -> Iterator[tuple[EngineProcess, EngineProcess]]:
    config = StoreConfig.test_min()
    with engine_with_topics(tmp_path / "a", config, {"orders": 2}) as a, \
            engine_with_topics(tmp_path / "b", config, {"orders": 2}) as b:
        yield a, b


@contextmanager
def paused(engine: EngineProcess) -> Iterator[None]:
    """Every process of the engine stopped (SIGSTOP), resumed at the end of the block."""
    processes = [psutil.Process(engine.pid), *psutil.Process(engine.pid).children(recursive=True)]
    for process in processes:
        process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for process in processes:
            process.send_signal(signal.SIGCONT)


def test_a_producer_where_nothing_listens_says_so_within_a_second() -> None:
    nowhere = f"tcp://127.0.0.1:{free_port()}"
    with Producer(nowhere, timeout_ms=TIMEOUT_MS) as producer:
        started = time.monotonic()
        with pytest.raises(EngineUnreachable):
            producer.send("orders", b"x")
        assert time.monotonic() - started < CONNECT_PROBE_MS / 1000 + 2

    async def send_async() -> float:
        async with AsyncProducer(nowhere, timeout_ms=TIMEOUT_MS) as producer:
            started = time.monotonic()
            with pytest.raises(EngineUnreachable):
                await producer.send("orders", b"x")
            return time.monotonic() - started

    assert asyncio.run(send_async()) < CONNECT_PROBE_MS / 1000 + 2


def test_a_set_producer_passes_an_engine_that_refuses_connections_at_once(
        two_engines: tuple[EngineProcess, EngineProcess]) -> None:
    _, live = two_engines
    address = f"tcp://127.0.0.1:{free_port()},{live.endpoint}"  # the first engine is gone
    with Producer(address, timeout_ms=TIMEOUT_MS) as producer:
        started = time.monotonic()
        result = producer.send("orders", b"to whichever engine is master")
        assert time.monotonic() - started < 3, "the producer waited for its deadline on a dead engine"
        assert producer.endpoint == live.endpoint and result.queue_offset == 0
        future = producer.send_async("orders", b"async too", queue_id=result.queue_id)
        assert future.result(timeout=5).queue_offset == 1


def test_a_set_producer_leaves_a_paused_engine_within_the_heartbeat_timeout(
        two_engines: tuple[EngineProcess, EngineProcess]) -> None:
    first, second = two_engines
    address = f"{first.endpoint},{second.endpoint}"
    with Producer(address, timeout_ms=TIMEOUT_MS) as producer:
        producer.send("orders", b"before", queue_id=0)
        producer.send_async("orders", b"async, before", queue_id=1).result(timeout=TIMEOUT_MS / 1000)
        assert producer.endpoint == first.endpoint
        with paused(first):
            started = time.monotonic()
            producer.send("orders", b"during the pause", queue_id=0)
            took_s = time.monotonic() - started
            async_started = time.monotonic()
            producer.send_async("orders", b"async, during the pause", queue_id=1).result(timeout=TIMEOUT_MS / 1000)
            async_took_s = time.monotonic() - async_started
        assert producer.endpoint == second.endpoint
    bound_s = HEARTBEAT_TIMEOUT_MS / 1000 + 2  # the heartbeat's timeout, then a look for the master
    assert took_s < bound_s and async_took_s < bound_s, (took_s, async_took_s)
    with second.client() as client:
        assert client.queue_stats("orders", 0)["max_offset"] == 1  # nothing sent there before the pause
        assert client.queue_stats("orders", 1)["max_offset"] == 1
