"""A client that watches its connection (``StoreClient(watch_connection=True)``, what a broker set's
producer uses) learns at once that the engine it waits on died, instead of at its deadline; and
``engine_answers`` says at once that nothing listens where a connection is refused."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from engine.client import ConnectionLost, RequestTimeout, StoreClient, engine_answers
from supervisor.launcher import free_port

pytestmark = pytest.mark.timeout(60)


def test_a_request_whose_connection_breaks_raises_connection_lost_at_once() -> None:
    context = zmq.Context.instance()
    peer = context.socket(zmq.ROUTER)  # a peer that takes the request and dies, as a killed front does
    port = peer.bind_to_random_port("tcp://127.0.0.1")
    taken = threading.Event()

    def take_then_die() -> None:
        peer.recv_multipart()
        taken.set()
        peer.close(linger=0)

    thread = threading.Thread(target=take_then_die)
    thread.start()
    with StoreClient(f"tcp://127.0.0.1:{port}", timeout_ms=20_000, watch_connection=True) as client:
        started = time.monotonic()
        with pytest.raises(ConnectionLost):
            client.request("status")
        assert taken.is_set() and time.monotonic() - started < 5, "the break was not noticed before the deadline"
        assert isinstance(ConnectionLost("x"), RequestTimeout)  # callers that handle a timeout handle it too
    thread.join(5)


def test_without_watching_the_same_break_waits_for_the_deadline() -> None:
    context = zmq.Context.instance()
    peer = context.socket(zmq.ROUTER)
    port = peer.bind_to_random_port("tcp://127.0.0.1")
    with StoreClient(f"tcp://127.0.0.1:{port}", timeout_ms=1_500) as client:
        client.send_raw(b"x")
        peer.recv_multipart()
        peer.close(linger=0)
        with pytest.raises(RequestTimeout) as raised:
            client.request("status")
        assert not isinstance(raised.value, ConnectionLost)


def test_engine_answers_says_no_at_once_where_a_connection_is_refused() -> None:
    started = time.monotonic()
    assert not engine_answers(f"tcp://127.0.0.1:{free_port()}", timeout_ms=10_000)
    assert time.monotonic() - started < 5


def test_the_async_client_fails_a_waiting_call_when_its_connection_breaks() -> None:
    import asyncio

    from rmqpy.aio import AsyncClient

    context = zmq.Context.instance()
    peer = context.socket(zmq.ROUTER)
    port = peer.bind_to_random_port("tcp://127.0.0.1")

    def take_then_die() -> None:
        peer.recv_multipart()
        peer.close(linger=0)

    async def ask() -> float:
        async with AsyncClient(f"tcp://127.0.0.1:{port}", timeout_ms=20_000, watch_connection=True) as client:
            started = time.monotonic()
            with pytest.raises(ConnectionLost):
                await client.request("status")
            return time.monotonic() - started

    thread = threading.Thread(target=take_then_die)
    thread.start()
    assert asyncio.run(ask()) < 5, "the break was not noticed before the deadline"
    thread.join(5)
