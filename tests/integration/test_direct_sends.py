"""Sends made straight to the writer (``engine/services/writer/direct_sends.py``): client -> writer
-> client, checked over the topic table the front saved (``engine/store/send_routes.py``).

The clients here are the protocol's own ROUTER (docs/protocol.md 1.1), which names its
connections, so a reply says whether the writer or the front made it, and ``StoreClient``."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import msgspec
import pytest
import zmq

from engine.client import EngineError, StoreClient
from engine.config import StoreConfig
from engine.errors import ErrorCode
from engine.ipc.control import control
from engine.ipc.endpoints import run_dir_for
from engine.ipc.messages import StatusQuery
from engine.store.send_routes import read_routes
from engine.store.shared_offsets import SEND_ROUTES, SharedOffsets
from harness.workload import wait_dispatched
from supervisor.launcher import EngineProcess
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(120)

_FRONT, _WRITER = b"front", b"writer"


class RawClient:
    """A ROUTER connected to the front and to the writer's port (the route's ``send_endpoint``)."""

    def __init__(self, endpoint: str) -> None:
        self.socket = zmq.Context.instance().socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.socket.setsockopt(zmq.ROUTING_ID, b"t" + os.urandom(15))
        self.socket.setsockopt(zmq.CONNECT_ROUTING_ID, _FRONT)
        self.socket.connect(endpoint)
        self.ids = iter(range(1, 1 << 30))
        route = self.ask(_FRONT, "route")[1]
        self.send_endpoint = route["send_endpoint"]
        assert self.send_endpoint in route["reply_endpoints"], route
        self.socket.setsockopt(zmq.CONNECT_ROUTING_ID, _WRITER)
        self.socket.connect(self.send_endpoint)

    def ask_raw(self, peer: bytes, frame: bytes) -> tuple[bytes, dict]:
        """(the connection the reply came on, the reply) to one frame sent to ``peer``; the writer's
        connection is made in the background, so a first send there waits for it (EHOSTUNREACH)."""
        deadline = time.monotonic() + 10
        while True:
            try:
                self.socket.send_multipart([peer, frame])
                break
            except zmq.ZMQError as exc:
                assert exc.errno == zmq.EHOSTUNREACH and time.monotonic() < deadline, exc
                self.socket.poll(5)
        assert self.socket.poll(10_000), "no reply"
        connection, reply = self.socket.recv_multipart()
        return connection, msgspec.msgpack.decode(reply)

    def ask(self, peer: bytes, op: str, **fields: object) -> tuple[bytes, dict]:
        request_id = next(self.ids)
        connection, reply = self.ask_raw(peer, msgspec.msgpack.encode({"v": 1, "op": op, "id": request_id, **fields}))
        assert reply["id"] == request_id, reply
        return connection, reply

    def close(self) -> None:
        self.socket.close()


def writer_detail(engine: EngineProcess) -> dict[str, int]:
    [writer] = [a for a in control(engine.store_dir, StatusQuery()).actors if a.name == "writer"]
    return writer.detail


@pytest.fixture
def engine(tmp_path: Path):
    config = StoreConfig.test_min().replace(auto_create_topic=False)
    with EngineProcess(tmp_path / "store", config=config) as process:
        yield process


def test_the_writer_answers_a_send_made_to_it_and_passes_back_what_the_front_decides(engine: EngineProcess) -> None:
    client = RawClient(engine.endpoint)
    try:
        assert client.ask(_FRONT, "create_topic", topic="orders", queue_count=2)[1]["ok"]
        connection, reply = client.ask(_WRITER, "send", topic="orders", messages=[{"body": b"straight"}])
        assert connection == _WRITER and reply["ok"], reply
        [result] = reply["results"]
        assert result["status"] == "PUT_OK" and result["queue_id"] in (0, 1)
        # Each refusal only the front can give is passed back, nothing stored.
        for fields, why in [({"topic": "nowhere"}, "does not know topic"),
                            ({"topic": "orders", "queue_id": 2}, "queue 2"),
                            ({"topic": "rmq_sys_wheel_timer"}, "does not know topic")]:
            connection, reply = client.ask(_WRITER, "send", messages=[{"body": b"x"}], **fields)
            assert connection == _WRITER and reply["error"]["code"] == ErrorCode.ROUTE_VIA_FRONT, reply
            assert why in reply["error"]["message"]
        connection, reply = client.ask(_WRITER, "pull", topic="orders", queue_id=0, offset=0)
        assert reply["error"]["code"] == ErrorCode.ROUTE_VIA_FRONT and "only sends" in reply["error"]["message"]
        # Bad input gets the protocol's errors from the writer, which keeps serving.
        for frame, code in [(b"\xc1", ErrorCode.MALFORMED_REQUEST),
                            (msgspec.msgpack.encode({"v": 9, "op": "send", "id": 5}), ErrorCode.UNSUPPORTED_VERSION),
                            (msgspec.msgpack.encode({"v": 1, "op": "sned", "id": 6}), ErrorCode.UNKNOWN_OP),
                            (msgspec.msgpack.encode({"v": 1, "op": "send", "id": 7, "topic": "orders"}),
                             ErrorCode.INVALID_FIELD),
                            (msgspec.msgpack.encode({"v": 1, "op": "send", "id": 9, "topic": "orders",
                                                     "queue_id": True}), ErrorCode.INVALID_FIELD),
                            (msgspec.msgpack.encode({"v": 1, "op": "send", "id": 8, "topic": "orders",
                                                     "messages": [{"body": b""}]}), ErrorCode.MESSAGE_ILLEGAL)]:
            connection, reply = client.ask_raw(_WRITER, frame)
            assert connection == _WRITER and reply["error"]["code"] == code, (frame, reply)
        # Frames outside the protocol's layout are dropped, one past the frame limit cuts the connection.
        pid = engine.actor_pids()["writer"]
        client.socket.send_multipart([_WRITER, b"", b"two", b"frames"])
        client.socket.send_multipart([_WRITER, b"x" * (engine.config.client_frame_bytes_max + 1)])
        deadline = time.monotonic() + 10
        while True:  # the writer's connection comes back (ZeroMQ reconnects it), the writer unharmed
            try:
                connection, reply = client.ask(_WRITER, "send", topic="orders", queue_id=1,
                                               messages=[{"body": b"after"}])
                break
            except AssertionError:  # the request was lost with the cut connection: asked again
                assert time.monotonic() < deadline
        assert connection == _WRITER and reply["ok"] and engine.actor_pids()["writer"] == pid
        # What was passed back stored nothing: the queues hold the two sends alone.
        with engine.client() as store:
            wait_dispatched(store)
            stored = [m["body"] for q in (0, 1) for m in store.pull("orders", q, 0)["messages"]]
        assert sorted(stored) == [b"after", b"straight"]
    finally:
        client.close()


def test_store_client_sends_straight_to_the_writer_and_through_the_front_what_it_passes_back(
        engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("orders", queue_count=2)
        client.request("ping")  # the route comes beside it; the writer's connection is made meanwhile
        wait_until("the client's connection to the writer", lambda: client.request("ping") and client._send_peer)
        for i in range(50):
            assert client.send_one("orders", b"m%d" % i)["status"] == "PUT_OK"
        with pytest.raises(EngineError) as refused:
            client.send_one("nowhere", b"x")
        assert refused.value.code == ErrorCode.TOPIC_NOT_FOUND  # the front's refusal, after the writer's pass-back
        client.create_topic("orders", queue_count=8)  # grown: the writer takes queue 7 at once
        assert client.send_one("orders", b"q7", queue_id=7)["queue_id"] == 7
    wait_until("the writer's figures", lambda: writer_detail(engine).get("direct_sends", 0) >= 50)
    detail = writer_detail(engine)
    assert detail["direct_sends"] >= 50 and detail["direct_sends_passed_on"] >= 1, detail


def test_a_writer_whose_routes_are_older_than_the_table_stores_nothing_under_them(engine: EngineProcess) -> None:
    """The slot says a newer table than the file holds (as if the front's write had not landed):
    every send made to the writer is passed back, and goes through the front."""
    client = RawClient(engine.endpoint)
    run_dir = run_dir_for(engine.store_dir)
    slots = SharedOffsets(run_dir)
    try:
        assert client.ask(_FRONT, "create_topic", topic="orders", queue_count=2)[1]["ok"]
        assert client.ask(_WRITER, "send", topic="orders", messages=[{"body": b"a"}])[1]["ok"]
        published = read_routes(run_dir).version
        assert slots.get(SEND_ROUTES) == published
        slots.set(SEND_ROUTES, published + 1)  # the front's slot, moved past its file here
        reply = client.ask(_WRITER, "send", topic="orders", messages=[{"body": b"b"}])[1]
        assert reply["error"]["code"] == ErrorCode.ROUTE_VIA_FRONT and "older" in reply["error"]["message"], reply
        connection, reply = client.ask(_FRONT, "send", topic="orders", messages=[{"body": b"b"}])
        assert reply["ok"], reply
        assert client.ask(_FRONT, "create_topic", topic="more", queue_count=1)[1]["ok"]  # the front writes again
        assert read_routes(run_dir).version == published + 2 == slots.get(SEND_ROUTES)
        connection, reply = client.ask(_WRITER, "send", topic="more", messages=[{"body": b"c"}])
        assert connection == _WRITER and reply["ok"], reply
    finally:
        slots.close()
        client.close()


def test_a_send_straight_to_the_writer_racing_deletions_and_recreations_never_lands_in_the_new_topic(
        engine: EngineProcess) -> None:
    """A producer sends to the writer without a pause while the topic is deleted and created again,
    ten times (no auto-creation). Whatever the re-created topic holds was answered after its
    creation was asked for (never a send answered before: that one lay below the deletion, or
    was refused), no send is answered PUT_OK between a deletion's answer and the creation, and
    every send answered after the creation is there, at queue offsets 0, 1, 2, ... per queue."""
    rounds, topic = 10, "racing"
    with engine.client() as admin:
        admin.create_topic(topic, queue_count=2)
    stop = threading.Event()
    outcomes: list[tuple[float, float, bytes, dict | None]] = []  # asked, answered, body, result
    sent = threading.Semaphore(0)

    def produce() -> None:
        with StoreClient(engine.endpoint, timeout_ms=10_000) as producer:
            n = 0
            deadline = time.monotonic() + 90
            while not stop.is_set() and time.monotonic() < deadline:
                n += 1
                body = b"s%d" % n
                asked = time.monotonic()
                try:
                    result = producer.send(topic, [{"body": body}])[0]
                except EngineError as exc:
                    assert exc.code == ErrorCode.TOPIC_NOT_FOUND, exc
                    result = None
                outcomes.append((asked, time.monotonic(), body, result))
                sent.release()

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        with engine.client() as admin:
            for _ in range(rounds):
                for _ in range(20):
                    assert sent.acquire(timeout=30)
                admin.delete_topic(topic)
                deleted = time.monotonic()
                for _ in range(5):  # sends meet a topic that is not there
                    assert sent.acquire(timeout=30)
                created_asked = time.monotonic()
                admin.create_topic(topic, queue_count=2)
            for _ in range(50):
                assert sent.acquire(timeout=30)
    finally:
        stop.set()
        producer.join(30)
    assert not producer.is_alive()
    stored = [o for o in outcomes if o[3] is not None]
    between = [o for o in stored if o[0] > deleted and o[1] < created_asked]
    assert not between, f"sends stored while the topic did not exist: {between[:3]}"
    with engine.client() as reader:
        wait_dispatched(reader)
        held = {q: [(m["queue_offset"], m["body"]) for m in reader.pull(topic, q, 0, max_messages=10_000)["messages"]]
                for q in (0, 1)}
    visible = {body: (q, offset) for q, messages in held.items() for offset, body in messages}
    answered = {o[2]: o for o in stored}
    early = [body for body in visible if body not in answered or answered[body][1] < created_asked]
    assert not early, f"the new topic holds sends answered before it was created: {early[:3]}"
    late = [o for o in stored if o[0] > created_asked]
    assert late and all(o[2] in visible for o in late), "a send answered after the creation is missing"
    for q, messages in held.items():
        assert [offset for offset, _ in messages] == list(range(len(messages))), q
    assert len(outcomes) > 200
