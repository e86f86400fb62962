"""Answers that skip the front (``engine/ipc/direct_replies.py``): the writer answers a send and an
owner a read straight to a client connected to them, the front's own answers still come from the
front, and a client that is not connected to them (yet, or any more) gets every answer through
the front.

The client here is the protocol's own (docs/protocol.md 1.1): a ROUTER that names each of its
connections, so that every reply says which connection it came on."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import msgspec
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from engine.client import ConnectionLost, EngineError, RequestTimeout, StoreClient
from engine.config import StoreConfig
from engine.ipc import direct_replies, endpoints
from engine.ipc.control import EventStream
from engine.ipc.curve import CurveKeys, keygen
from engine.store.records import owner_of
from harness.faults import kill_actor, pause_actor
from harness.workload import wait_dispatched
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(90)

_FRONT = b"front"


class RawClient:
    """A ROUTER client: requests to the front, replies from any connection, each with its name."""

    def __init__(self, endpoint: str, *, direct: bool = True, curve: CurveKeys | None = None) -> None:
        self.socket = zmq.Context.instance().socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            curve.apply(self.socket)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.socket.setsockopt(zmq.ROUTING_ID, b"t" + os.urandom(15))
        self.socket.setsockopt(zmq.CONNECT_ROUTING_ID, _FRONT)
        self.socket.connect(endpoint)
        self.ids = iter(range(1, 1 << 30))
        self.names: dict[str, bytes] = {}
        if direct:
            for k, reply_endpoint in enumerate(self.ask("route")[1]["reply_endpoints"]):
                self.names[reply_endpoint] = b"d%d" % k
                self.socket.setsockopt(zmq.CONNECT_ROUTING_ID, b"d%d" % k)
                self.socket.connect(reply_endpoint)

    def ask(self, op: str, **fields: object) -> tuple[bytes, dict]:
        """(the connection the reply came on, the reply)."""
        request_id = next(self.ids)
        self.socket.send_multipart([_FRONT, msgspec.msgpack.encode({"v": 1, "op": op, "id": request_id, **fields})])
        assert self.socket.poll(10_000), f"no reply to {op}"
        connection, frame = self.socket.recv_multipart()
        reply = msgspec.msgpack.decode(frame)
        assert reply["id"] == request_id and reply["ok"], reply
        return connection, reply

    def send(self, topic: str, queue_id: int = 0) -> bytes:
        return self.ask("send", topic=topic, queue_id=queue_id, messages=[{"body": b"m"}])[0]

    def first_direct_send(self, topic: str, deadline_s: float = 10) -> bytes:
        """Send until an answer comes straight from the writer (its connection is made in the
        background): the connection it came on."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            connection = self.send(topic)
            if connection != _FRONT:
                return connection
            self.socket.poll(5)  # let the connection's handshake go on, then ask again
        raise AssertionError(f"no send answered directly within {deadline_s} s")

    def close(self) -> None:
        self.socket.close()


def test_the_writer_answers_sends_and_the_owners_reads_straight_to_the_client(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("orders", queue_count=4)
    raw = RawClient(engine.endpoint)
    try:
        route = raw.ask("route")[1]
        writer, *owners = route["reply_endpoints"]
        assert len(owners) == StoreConfig.test_min().consume_queue_owner_count
        assert raw.first_direct_send("orders") == raw.names[writer]
        assert {raw.send("orders", queue_id=q) for q in range(4) for _ in range(5)} == {raw.names[writer]}
        pulled = {raw.ask("pull", topic="orders", queue_id=q, offset=0, max_messages=32)[0] for q in range(4)}
        assert pulled == {raw.names[owner] for owner in owners}, "each queue's owner answers its pull"
        assert raw.ask("ping")[0] == _FRONT, "what the front answers itself comes from the front"
        assert raw.ask("queue_stats", topic="orders", queue_id=0)[0] in {raw.names[o] for o in owners}
    finally:
        raw.close()


def test_a_client_zeromq_names_gets_its_answers_through_the_front(engine: EngineProcess) -> None:
    """A DEALER (the C and Node clients', a REQ's): ZeroMQ gives it a routing id beginning with a 0
    byte, which marks it as a client the actors do not answer directly."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(engine.endpoint)
    try:
        for request_id, (op, fields) in enumerate([("create_topic", {"topic": "plain", "queue_count": 1}),
                                                   ("send", {"topic": "plain", "messages": [{"body": b"x"}]}),
                                                   ("pull", {"topic": "plain", "queue_id": 0, "offset": 0})], 1):
            dealer.send(msgspec.msgpack.encode({"v": 1, "op": op, "id": request_id, **fields}))
            assert dealer.poll(10_000)
            reply = msgspec.msgpack.decode(dealer.recv())
            assert reply["id"] == request_id and reply["ok"], reply
    finally:
        dealer.close()


def test_a_long_poll_is_answered_while_the_front_is_paused(engine: EngineProcess, store_dir: Path) -> None:
    """The owner's answer to a parked pull reaches the client with the front stopped: the front is
    not on the answer's way."""
    with engine.client() as client:
        client.create_topic("quiet", queue_count=1)
    raw = RawClient(engine.endpoint)
    try:
        owner = raw.ask("pull", topic="quiet", queue_id=0, offset=0, max_wait_ms=0)[0]
        deadline = time.monotonic() + 10
        while owner == _FRONT and time.monotonic() < deadline:  # until the owner's connection is made
            raw.socket.poll(5)
            owner = raw.ask("pull", topic="quiet", queue_id=0, offset=0, max_wait_ms=0)[0]
        assert owner != _FRONT, "the owner's connection was never made"
        raw.socket.send_multipart([_FRONT, msgspec.msgpack.encode(
            {"v": 1, "op": "pull", "id": 99, "topic": "quiet", "queue_id": 0, "offset": 0, "max_wait_ms": 1_500})])
        from tests.helpers import parked_requests

        deadline = time.monotonic() + 10
        while parked_requests(engine) == 0:  # the front has passed it on: the owner holds it
            assert time.monotonic() < deadline, "the pull was never parked"
            raw.socket.poll(10)
        _name, front = pause_actor(store_dir, "front")
        try:
            assert raw.socket.poll(10_000), "no answer to the parked pull while the front was paused"
            connection, frame = raw.socket.recv_multipart()
        finally:
            front.resume()
        reply = msgspec.msgpack.decode(frame)
        assert (connection, reply["id"], reply["ok"], reply["messages"]) == (owner, 99, True, [])
    finally:
        raw.close()


def test_a_restarted_writer_listens_where_it_did_and_answers_directly_again(engine: EngineProcess,
                                                                         store_dir: Path) -> None:
    run_dir = endpoints.run_dir_for(store_dir)
    with engine.client() as client:
        client.create_topic("orders", queue_count=1)
    raw = RawClient(engine.endpoint)
    events = EventStream(store_dir)
    try:
        writer = raw.first_direct_send("orders")
        listening = direct_replies.endpoint_file(run_dir, "writer").read_text()
        kill_actor(store_dir, "writer")
        events.wait_for("recovery.done", name="writer")
        assert direct_replies.endpoint_file(run_dir, "writer").read_text() == listening
        deadline = time.monotonic() + 10
        with engine.client() as client:  # sends go on, once the front has found the restarted writer
            while True:
                try:
                    assert client.send("orders", [{"body": b"after"}], queue_id=0)[0]["queue_offset"] >= 1
                    break
                except EngineError as exc:  # the front's connection to it is being made again (10 ms a try)
                    assert exc.name == "SERVICE_NOT_AVAILABLE" and time.monotonic() < deadline, exc
                    time.sleep(0.01)  # the pace of the retries; the deadline bounds them
        assert raw.first_direct_send("orders") == writer
    finally:
        events.close()
        raw.close()


def test_an_owner_lost_is_no_lost_connection_to_a_client_that_watches_its_connection(engine: EngineProcess,
                                                                                     store_dir: Path) -> None:
    """``watch_connection`` reports the front's connection breaking (``ConnectionLost``): the break
    of a direct one, an owner killed under a parked pull, is not that; the pull times out as any
    request its actor dropped."""
    with engine.client() as client:
        client.create_topic("quiet", queue_count=1)
    owner = f"owner-{owner_of('quiet', 0, StoreConfig.test_min().consume_queue_owner_count)}"
    with StoreClient(engine.endpoint, timeout_ms=1_000, watch_connection=True) as watcher:
        deadline = time.monotonic() + 10
        while not watcher._direct:  # until the route answer came: its connections are made from then on
            assert time.monotonic() < deadline
            watcher.ping()
        raw = RawClient(engine.endpoint)  # the same connections, observed: the owner's is made
        try:
            raw.ask("pull", topic="quiet", queue_id=0, offset=0)
        finally:
            raw.close()
        events = EventStream(store_dir)
        killer = threading.Timer(0.3, kill_actor, (store_dir, owner))  # while the pull below is parked
        killer.start()
        try:
            with pytest.raises(RequestTimeout) as info:
                watcher.pull("quiet", 0, 0, max_wait_ms=1_000)
            assert not isinstance(info.value, ConnectionLost), info.value
            events.wait_for("recovery.done", name=owner)
        finally:
            killer.join()
            events.close()


def test_what_a_client_sends_on_an_owners_direct_connection_is_dropped(engine: EngineProcess) -> None:
    """An owner takes no requests on its direct connection (the writer takes sends on its own:
    tests/integration/test_direct_sends.py): nothing is answered, stored or broken."""
    with engine.client() as client:
        client.create_topic("orders", queue_count=1)
    raw = RawClient(engine.endpoint)
    try:
        raw.first_direct_send("orders")
        owner = raw.names[raw.ask("route")[1]["reply_endpoints"][1]]  # the writer's is first, then owner-0's
        pid = engine.actor_pids()["owner-0"]
        request = msgspec.msgpack.encode({"v": 1, "op": "send", "id": 7, "topic": "orders",
                                          "messages": [{"body": b"not here"}]})
        for frames in ([request], [b"garbage"], [b"", b"two", b"frames"], [b"x" * 100_000]):
            raw.socket.send_multipart([owner, *frames])
        assert raw.send("orders") in (raw.names[raw.ask("route")[1]["reply_endpoints"][0]], _FRONT)
        # A bounded wait for what must not come: an answer to what was sent on the direct connection.
        assert not raw.socket.poll(200), "something answered what was sent on a direct connection"
        assert engine.actor_pids()["owner-0"] == pid
        with StoreClient(engine.endpoint) as client:
            wait_dispatched(client)
            bodies = {m["body"] for m in client.pull("orders", 0, 0)["messages"]}
        assert bodies == {b"m"}, "only the sends made through the front were stored"
    finally:
        raw.close()


def test_with_direct_replies_off_nothing_else_listens(store_dir: Path) -> None:
    engine = EngineProcess(store_dir, config=StoreConfig.test_min().replace(direct_replies_enabled=False))
    engine.start()
    try:
        raw = RawClient(engine.endpoint, direct=False)
        try:
            assert raw.ask("route")[1]["reply_endpoints"] == []
            with engine.client() as client:
                client.create_topic("orders", queue_count=1)
                assert client.route()["reply_endpoints"] == []
                client.send("orders", [{"body": b"a"}])
                wait_dispatched(client)
            assert raw.send("orders") == _FRONT
            assert raw.ask("pull", topic="orders", queue_id=0, offset=0)[0] == _FRONT
        finally:
            raw.close()
        assert not list(endpoints.run_dir_for(store_dir).glob("replies-*"))
    finally:
        engine.stop()


def test_with_curve_the_direct_ports_take_the_clients_the_front_takes(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    allowed = tmp_path / "allowed"
    server_public, server_secret = keygen(keys, "server")
    client_public, client_secret = keygen(keys, "billing")
    allowed.mkdir()
    (allowed / "billing.key").write_bytes(client_public.read_bytes())
    engine = EngineProcess(tmp_path / "store", config=StoreConfig.test_min().replace(
        curve_enabled=True, curve_server_secret_key_file=str(server_secret), curve_authorized_keys_dir=str(allowed)))
    engine.start()
    try:
        curve = CurveKeys.from_files(server_public, client_secret)
        with StoreClient(engine.endpoint, curve=curve) as client:
            client.create_topic("orders", queue_count=1)
        raw = RawClient(engine.endpoint, curve=curve)
        try:
            assert raw.first_direct_send("orders") == b"d0"
            writer_endpoint = next(iter(raw.names))
        finally:
            raw.close()
        _public, stranger_secret = keygen(keys, "stranger")  # not allowed: the direct ports refuse it too
        stranger = zmq.Context.instance().socket(zmq.ROUTER)
        stranger.setsockopt(zmq.LINGER, 0)
        CurveKeys.from_files(server_public, stranger_secret).apply(stranger)
        monitor = stranger.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        try:
            stranger.connect(writer_endpoint)
            assert monitor.poll(10_000), "no handshake outcome for a key the engine does not allow"
            assert recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        finally:
            stranger.disable_monitor()
            monitor.close()
            stranger.close()
    finally:
        engine.stop()
