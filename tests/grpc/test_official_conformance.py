"""The official RocketMQ 5 clients and this project's clients agree on the same messages.

The official Python and Node clients produce over gRPC; the official Python and Node simple
consumers receive and ack over gRPC, and this project's Python, C and Node clients pull over
the ZeroMQ protocol. Every consumer must see every message with the same body, keys, tag, user
properties, message id and born timestamp; the store timestamp, which the official Node client
does not show, must agree among the others. Then the official clients' quick-start examples
(examples/rocketmq5, their own code with the endpoint changed) run against the engine.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rocketmq import FilterExpression, Message, Producer, SimpleConsumer

from supervisor.launcher import EngineProcess
from tests.conformance.test_clients import DRIVERS, drive, require_drivers
from tests.grpc.conftest import grpc_config, official
from tests.helpers import engine_with_topics, require, wait_dispatched

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "rocketmq5"
NODE_DRIVER = ["node", str(Path(__file__).with_name("official_node.cjs"))]
TOPIC = "official-conformance"
ALL_BYTES = bytes(range(256))


def messages_of(client: str) -> list[dict[str, Any]]:
    return [
        {"body": f"plain text from {client}".encode(), "tag": "TagA", "keys": [f"{client}-k1"],
         "properties": {"region": "eu-west"}},
        {"body": ALL_BYTES, "tag": "bin\u00e4r", "keys": [f"{client}-bin", f"{client}-bin2"],
         "properties": {"note": "caf\u00e9 \u2615 \u65e5\u672c\u8a9e", "\u00e9t\u00e9": "\u00fc\u00f1"}},
        {"body": b"\x00\x00\x00zero from " + client.encode(), "tag": "\u6807\u7b7e", "keys": [], "properties": {}},
    ]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def run_node(endpoint: str, commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    done = subprocess.run([*NODE_DRIVER, endpoint], input=json.dumps(commands).encode(), capture_output=True,
                          timeout=120, check=False)
    assert done.returncode == 0, f"official Node driver failed: {done.stderr.decode()}"
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    require_drivers()
    require((EXAMPLES / "node_modules" / "rocketmq-client-nodejs").is_dir(), "examples/rocketmq5/node_modules")
    with engine_with_topics(tmp_path_factory.mktemp("official") / "store", grpc_config(), {TOPIC: 2}) as process:
        yield process


def produce_with_official_python(engine: EngineProcess) -> list[str]:
    producer = Producer(official(engine), (TOPIC,))
    producer.startup()
    try:
        ids = []
        for sent in messages_of("py-official"):
            m = Message()
            m.topic, m.body, m.tag = TOPIC, sent["body"], sent["tag"]
            for key in sent["keys"]:
                m.keys = key
            for name, value in sent["properties"].items():
                m.add_property(name, value)
            ids.append(producer.send(m).message_id)
        return ids
    finally:
        producer.shutdown()


def receive_with_official_python(engine: EngineProcess, count: int) -> list[dict[str, Any]]:
    consumer = SimpleConsumer(official(engine), "conf-py-official", {TOPIC: FilterExpression()}, await_duration=1)
    consumer.startup()
    got: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            for m in consumer.receive(32, 15):
                assert not m.corrupted, m.message_id
                got.append({"message_id": m.message_id, "body_b64": b64(m.body), "tag": m.tag,
                            "keys": sorted(m.keys), "properties": dict(m.properties),
                            "born_timestamp": m.born_timestamp,
                            "store_timestamp": m._Message__store_timestamp})  # kept, not shown, by the client
                consumer.ack(m)
    finally:
        consumer.shutdown()
    return got


def pulled_by(client: str, endpoint: str) -> list[dict[str, Any]]:
    replies = drive(client, endpoint, [{"op": "pull", "topic": TOPIC, "queue_id": q, "offset": 0,
                                        "max_messages": 64} for q in (0, 1)])
    return [{"message_id": m["uniq_key"], "body_b64": m["body_b64"], "tag": m["tags"], "keys": sorted(m["keys"]),
             "properties": {k: v for k, v in m["properties"].items() if k != "UNIQ_KEY"},
             "born_timestamp": m["born_timestamp"], "store_timestamp": m["store_timestamp"]}
            for reply in replies for m in reply["messages"]]


def by_id(messages: list[dict[str, Any]], drop: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    return {m["message_id"]: {k: v for k, v in m.items() if k not in drop} for m in messages}


def test_official_and_own_clients_agree_field_for_field(engine: EngineProcess) -> None:
    grpc = engine.config.grpc_endpoint
    ids = produce_with_official_python(engine)
    [node_sent] = run_node(grpc, [{"op": "send", "topic": TOPIC, "messages": [
        {**{k: v for k, v in m.items() if k != "body"}, "body_b64": b64(m["body"])} for m in messages_of("node")]}])
    ids += [r["message_id"] for r in node_sent["receipts"]]
    assert len(set(ids)) == 6
    with engine.client() as client:
        wait_dispatched(client)

    views = {"python-official": by_id(receive_with_official_python(engine, 6))}
    [node_received] = run_node(grpc, [{"op": "receive", "group": "conf-node-official", "topic": TOPIC,
                                       "count": 6, "ack": True}])
    assert {(m["delivery_attempt"], m["message_group"], m["corrupted"]) for m in node_received["messages"]} == \
        {(1, None, False)}  # the body digest checks out in the Node client too
    views["node-official"] = by_id([{**m, "keys": sorted(m["keys"])} for m in node_received["messages"]],
                                   drop=("delivery_attempt", "message_group", "corrupted"))
    for client in DRIVERS:
        views[client] = by_id(pulled_by(client, engine.endpoint))

    reference = views["python"]
    assert sorted(reference) == sorted(ids)
    for name, view in views.items():
        assert {i: {k: v for k, v in m.items() if k != "store_timestamp"} for i, m in view.items()} == \
            {i: {k: v for k, v in m.items() if k != "store_timestamp"} for i, m in reference.items()}, name
        if name != "node-official":
            assert {i: m["store_timestamp"] for i, m in view.items()} == \
                {i: m["store_timestamp"] for i, m in reference.items()}, name
    sent = {(b64(m["body"]), tuple(sorted(m["keys"]))): m for c in ("py-official", "node") for m in messages_of(c)}
    for message in reference.values():
        expected = sent.pop((message["body_b64"], tuple(message["keys"])))
        assert message["tag"] == expected["tag"] and message["properties"] == expected["properties"]
    assert not sent


@pytest.fixture
def run_example(engine: EngineProcess, tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """Starts an example with its endpoint (127.0.0.1:8081, RocketMQ's proxy port) set to this
    engine's. The copy lies beside the original, so that its node_modules resolve; it is removed
    at the end."""
    copies: list[Path] = []

    def run(name: str) -> subprocess.Popen[bytes]:
        script = EXAMPLES / f".test-{tmp_path.name}-{name}"
        script.write_text((EXAMPLES / name).read_text().replace("127.0.0.1:8081", engine.config.grpc_endpoint))
        copies.append(script)
        command = [sys.executable, str(script)] if name.endswith(".py") else ["node", str(script)]
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.PIPE)

    yield run
    for script in copies:
        script.unlink(missing_ok=True)


def test_the_official_quick_start_examples_run_against_the_engine(
        run_example: Callable[[str], subprocess.Popen[bytes]]) -> None:
    producer = run_example("normal_producer_example.py")
    out, _ = producer.communicate(timeout=60)
    assert producer.returncode == 0 and out.count(b"send message success") == 10, out.decode()

    consumer = run_example("simple_consumer_example.py")  # loops until stopped
    assert consumer.stdout is not None
    acked = 0
    deadline = time.monotonic() + 60
    while acked < 10 and time.monotonic() < deadline:
        line = consumer.stdout.readline()
        acked += b"ack message" in line
    consumer.kill()
    consumer.communicate(timeout=30)
    assert acked == 10

    for name in ("Producer.cjs", "SimpleConsumer.cjs"):
        example = run_example(name)
        out, _ = example.communicate(timeout=60)
        assert example.returncode == 0, out.decode()
        if name == "SimpleConsumer.cjs":
            assert b"got 1 messages" in out and b"rocketmq-client-nodejs world" in out, out.decode()


def test_the_official_node_push_consumer_acks_redelivers_and_dead_letters(engine: EngineProcess) -> None:
    topic, group = "official-node-push", "node-push-g"
    with engine.client() as client:
        client.create_topic(topic, queue_count=2)
        client.send(topic, [{"body": b"good"}, {"body": b"bad"}])
    attempts = engine.config.max_delivery_attempts
    [pushed] = run_node(engine.config.grpc_endpoint, [{"op": "push", "group": group, "topic": topic,
                                                       "fail_b64": [b64(b"bad")], "deliveries": 1 + attempts}])
    deliveries = [(base64.b64decode(body), attempt) for body, attempt in pushed["deliveries"]]
    assert sorted(deliveries) == sorted([(b"good", 1)] + [(b"bad", n) for n in range(1, attempts + 1)])
    with engine.client() as client:
        dead = client.pull(f"%DLQ%{group}", 0, 0, max_wait_ms=5_000)["messages"]
    assert [m["body"] for m in dead] == [b"bad"]
