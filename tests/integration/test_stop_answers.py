"""A stop answers every request still queued: the front's and the writer's clients hear
SERVICE_NOT_AVAILABLE at once instead of waiting out their deadline (docs/protocol.md 6).

The actor is paused (SIGSTOP) so that requests queue for it, and the engine is stopped; once the
supervisor's SIGTERM is pending for the paused actor, it runs again and stops with the requests
still queued. The client is a ROUTER connected to the front and to the actors that answer
directly, as ``StoreClient`` is: the writer answers past the front, which stops before it."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import psutil
import pytest
import zmq

from engine.errors import ErrorCode
from harness.faults import pause_actor
from harness.workload import wait_dispatched
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(90)

_FRONT = b"front"
_QUEUED = 20  # requests in flight at the stop
_ANSWERED_WITHIN_S = 5  # well before the client's deadline (10 s by default)


class RawClient:
    """Requests to the front, replies from any of its connections, matched by id."""

    def __init__(self, endpoint: str) -> None:
        self.socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.socket.setsockopt(zmq.ROUTING_ID, b"t" + os.urandom(15))
        self.socket.setsockopt(zmq.CONNECT_ROUTING_ID, _FRONT)
        self.socket.connect(endpoint)
        self.next_id = 1

    def connect_direct(self) -> None:
        """To the actors that answer clients directly (the ``route`` answer's ``reply_endpoints``)."""
        for k, endpoint in enumerate(self.ask("route")[1]["reply_endpoints"]):
            self.socket.setsockopt(zmq.CONNECT_ROUTING_ID, b"d%d" % k)
            self.socket.connect(endpoint)

    def request(self, op: str, **fields: object) -> int:
        request_id, self.next_id = self.next_id, self.next_id + 1
        self.socket.send_multipart([_FRONT, msgspec.msgpack.encode({"v": 1, "op": op, "id": request_id, **fields})])
        return request_id

    def replies(self, count: int, within_s: float) -> dict[int, tuple[bytes, dict]]:
        """The next ``count`` replies by id, with the connection each came on; fewer if ``within_s`` passes."""
        found: dict[int, tuple[bytes, dict]] = {}
        deadline = time.monotonic() + within_s
        while len(found) < count and (remaining_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            if self.socket.poll(remaining_ms):
                connection, frame = self.socket.recv_multipart()
                reply = msgspec.msgpack.decode(frame)
                found[reply["id"]] = (connection, reply)
        return found

    def ask(self, op: str, **fields: object) -> tuple[bytes, dict]:
        request_id = self.request(op, **fields)
        connection, reply = self.replies(1, 10)[request_id]
        assert reply["ok"], reply
        return connection, reply

    def close(self) -> None:
        self.socket.close()


def _sigterm_pending(process: psutil.Process) -> bool:
    """SIGTERM sent to the process and not yet taken (it is stopped): /proc's shared pending set."""
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("ShdPnd:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    raise AssertionError("no ShdPnd in /proc status")


@contextmanager
def stopping(engine: EngineProcess, paused: psutil.Process) -> Iterator[None]:
    """Stop the engine (in a thread: ``EngineProcess.stop`` waits for it) and let ``paused`` run once
    the supervisor's SIGTERM is pending for it; the stop is awaited at the end."""
    stopper = threading.Thread(target=engine.stop)
    stopper.start()
    try:
        deadline = time.monotonic() + 30
        while not _sigterm_pending(paused):
            assert time.monotonic() < deadline, "the supervisor never signalled the paused actor"
            time.sleep(0.005)  # a signal's arrival in a stopped process has no event to wait on: /proc is read
        paused.resume()
        yield
    finally:
        if paused.is_running():
            paused.resume()
        stopper.join(60)
        assert not stopper.is_alive(), "the engine did not stop"


def _assert_refused_as_stopping(replies: dict[int, tuple[bytes, dict]], sent: list[int]) -> None:
    assert sorted(replies) == sent, f"{len(sent) - len(replies)} of {len(sent)} requests got no answer"
    for _connection, reply in replies.values():
        assert not reply["ok"], reply
        assert reply["error"]["code"] == ErrorCode.SERVICE_NOT_AVAILABLE, reply
        assert "stopping" in reply["error"]["message"], reply


def test_requests_queued_at_the_front_are_refused_when_the_engine_stops(engine: EngineProcess,
                                                                        store_dir: Path) -> None:
    raw = RawClient(engine.endpoint)
    try:
        raw.ask("ping")
        _, front = pause_actor(store_dir, "front")
        sent = [raw.request("ping") for _ in range(_QUEUED)]
        with stopping(engine, front):
            replies = raw.replies(_QUEUED, _ANSWERED_WITHIN_S)
        _assert_refused_as_stopping(replies, sent)
        assert {connection for connection, _ in replies.values()} == {_FRONT}
    finally:
        raw.close()


def test_sends_queued_at_the_writer_are_refused_when_the_engine_stops(engine: EngineProcess,
                                                                      store_dir: Path) -> None:
    raw = RawClient(engine.endpoint)
    try:
        raw.ask("create_topic", topic="orders", queue_count=1)
        raw.connect_direct()
        stored, deadline = 0, time.monotonic() + 10
        while raw.ask("send", topic="orders", queue_id=0, messages=[{"body": b"m"}])[0] == _FRONT:
            stored += 1
            assert time.monotonic() < deadline, "the writer's direct connection was never made"
            raw.socket.poll(5)  # let the connection's handshake go on, then send again
        stored += 1
        _, writer = pause_actor(store_dir, "writer")
        sent = [raw.request("send", topic="orders", queue_id=0, messages=[{"body": b"late"}])
                for _ in range(_QUEUED)]
        with stopping(engine, writer):
            replies = raw.replies(_QUEUED, _ANSWERED_WITHIN_S)
        _assert_refused_as_stopping(replies, sent)
    finally:
        raw.close()
    with EngineProcess(store_dir, config=engine.config) as again, again.client() as client:
        wait_dispatched(client)
        assert client.queue_stats("orders", 0)["max_offset"] == stored, "a refused send was stored"
