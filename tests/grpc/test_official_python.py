"""The official RocketMQ 5 Python client (PyPI rocketmq-python-client), unchanged, against the
engine's gRPC endpoint: producer, simple consumer, push consumer, and the API's status codes.

What the client is given is checked against what the engine's own protocol reads back."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from rocketmq import (
    ConsumeResult,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import Code, definition_pb2, service_pb2
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.exception import BadRequestException

from engine.names import dead_letter_topic
from supervisor.launcher import EngineProcess
from tests.grpc.conftest import official
from tests.helpers import wait_dispatched

pytestmark = pytest.mark.timeout(120)


def message(topic: str, body: bytes, *, tag: str | None = None, keys: tuple[str, ...] = (),
            properties: dict[str, str] | None = None) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    for key in keys:
        m.keys = key
    for name, value in (properties or {}).items():
        m.add_property(name, value)
    return m


@pytest.fixture
def producer(grpc_engine: EngineProcess) -> Iterator[Producer]:
    started = Producer(official(grpc_engine))
    started.startup()
    yield started
    started.shutdown()


def create(engine: EngineProcess, topic: str, queues: int = 4) -> None:
    with engine.client() as client:
        client.create_topic(topic, queue_count=queues)


def receive_all(consumer: SimpleConsumer, count: int, *, invisible_s: int = 20, deadline_s: float = 30) -> list:
    got: list = []
    deadline = time.monotonic() + deadline_s
    while len(got) < count and time.monotonic() < deadline:
        got.extend(consumer.receive(32, invisible_s))
    return got


def test_what_the_producer_sends_is_stored_as_sent_and_its_receipt_names_it(grpc_engine: EngineProcess,
                                                                            producer: Producer) -> None:
    topic = "py-send"
    create(grpc_engine, topic)
    sent = [message(topic, b"body-%d" % n, tag="TagA", keys=(f"order-{n}",), properties={"region": "eu", "n": str(n)})
            for n in range(6)]
    receipts = [producer.send(m) for m in sent[:3]]
    receipts += [producer.send_async(m).result(timeout=10) for m in sent[3:]]
    with grpc_engine.client() as client:
        wait_dispatched(client)
        for n, receipt in enumerate(receipts):
            assert len(receipt.message_id) == 34
            [stored] = client.query_by_key(topic, receipt.message_id)
            assert stored["uniq_key"] == receipt.message_id
            assert stored["queue_offset"] == receipt.offset
            assert stored["body"] == b"body-%d" % n and stored["tags"] == "TagA" and stored["keys"] == [f"order-{n}"]
            assert {k: v for k, v in stored["properties"].items() if k != "UNIQ_KEY"} == {"region": "eu", "n": str(n)}
            pulled = client.pull(topic, stored["queue_id"], receipt.offset, max_messages=1)["messages"]
            assert pulled == [stored]
    shown = subprocess.run([sys.executable, "-m", "engine", "query", "--endpoint", grpc_engine.endpoint, "--json",
                            "--topic", topic, "--id", receipts[0].message_id], capture_output=True, check=True)
    [found] = json.loads(shown.stdout)
    assert (found["uniq_key"], found["queue_offset"]) == (receipts[0].message_id, receipts[0].offset)


def test_a_simple_consumer_receives_with_its_tag_filter_and_acked_messages_do_not_come_back(
        grpc_engine: EngineProcess, producer: Producer) -> None:
    topic = "py-simple"
    create(grpc_engine, topic)
    for n in range(10):
        producer.send(message(topic, b"m%d" % n, tag="TagA" if n % 2 == 0 else "TagB"))
    consumer = SimpleConsumer(official(grpc_engine), "py-simple-g", {topic: FilterExpression("TagA")},
                              await_duration=1)
    consumer.startup()
    try:
        got = receive_all(consumer, 5, invisible_s=2)
        assert sorted(m.body for m in got) == [b"m0", b"m2", b"m4", b"m6", b"m8"]
        assert {m.tag for m in got} == {"TagA"} and {m.delivery_attempt for m in got} == {1}
        for m in got:
            consumer.ack(m)
        # their invisible time (2 s) passes: nothing comes back
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            assert consumer.receive(32, 2) == []
    finally:
        consumer.shutdown()


def test_an_unacked_message_comes_back_with_the_next_attempt_and_a_changed_duration_holds(
        grpc_engine: EngineProcess, producer: Producer) -> None:
    topic = "py-redeliver"
    create(grpc_engine, topic, queues=1)
    producer.send(message(topic, b"once"))
    producer.send(message(topic, b"held"))
    consumer = SimpleConsumer(official(grpc_engine), "py-redeliver-g", {topic: FilterExpression()}, await_duration=1)
    consumer.startup()
    try:
        first = {m.body: m for m in receive_all(consumer, 2, invisible_s=1)}
        asked = time.monotonic()
        consumer.change_invisible_duration(first[b"held"], 30)
        [again] = receive_all(consumer, 1, invisible_s=10)
        assert again.body == b"once" and again.delivery_attempt == 2 and time.monotonic() - asked >= 0.5
        consumer.ack(again)
        with pytest.raises(BadRequestException) as stale:
            consumer.ack(first[b"once"])  # the first delivery's handle is stale now
        assert stale.value.code == Code.INVALID_RECEIPT_HANDLE
        assert consumer.receive(32, 10) == []  # "held" is invisible for 30 s
    finally:
        consumer.shutdown()


class Failing(MessageListener):
    """Fails every message; records each delivery."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[bytes, int]] = []
        self.event = threading.Event()

    def consume(self, message: Any) -> ConsumeResult:
        self.deliveries.append((message.body, message.delivery_attempt))
        self.event.set()
        return ConsumeResult.FAILURE


def test_a_push_consumer_failure_is_redelivered_then_dead_lettered_after_the_attempt_limit(
        grpc_engine: EngineProcess, producer: Producer) -> None:
    topic, group = "py-push", "py-push-g"
    create(grpc_engine, topic, queues=2)
    listener = Failing()
    consumer = PushConsumer(official(grpc_engine), group, listener, {topic: FilterExpression()})
    consumer.startup()
    try:
        receipt = producer.send(message(topic, b"poison", keys=("p-1",), properties={"why": "test"}))
        with grpc_engine.client() as client:
            deadline = time.monotonic() + 30
            dead: list = []
            while not dead and time.monotonic() < deadline:
                listener.event.wait(0.2)
                if dead_letter_topic(group) in {t["topic"] for t in client.list_topics()}:  # made at the 1st pop
                    dead = client.pull(dead_letter_topic(group), 0, 0, max_wait_ms=200)["messages"]
        assert [m["body"] for m in dead] == [b"poison"]
        assert dead[0]["properties"]["DLQ_ORIGIN_TOPIC"] == topic and dead[0]["properties"]["why"] == "test"
        assert dead[0]["uniq_key"] == receipt.message_id  # the id the producer was given, kept
        assert listener.deliveries == [(b"poison", 1), (b"poison", 2), (b"poison", 3)]
    finally:
        consumer.shutdown()


def test_a_delay_message_arrives_at_its_delivery_time(grpc_engine: EngineProcess, producer: Producer) -> None:
    topic = "py-delay"
    create(grpc_engine, topic)
    delayed = message(topic, b"later")
    delayed.delivery_timestamp = int(time.time()) + 2  # the client sends whole seconds
    receipt = producer.send(delayed)
    consumer = SimpleConsumer(official(grpc_engine), "py-delay-g", {topic: FilterExpression()})
    consumer.startup()
    try:
        [got] = receive_all(consumer, 1)
        assert time.time() >= delayed.delivery_timestamp  # not before its time
        assert (got.message_id, got.body) == (receipt.message_id, b"later")
        # its delivery time comes back, as RocketMQ's proxy answers it (ms, from TIMER_DELIVER_MS)
        assert got.delivery_timestamp == delayed.delivery_timestamp * 1000
        assert "TIMER_DELIVER_MS" not in got.properties and "TIMER_OUT_MS" not in got.properties
        consumer.ack(got)
    finally:
        consumer.shutdown()


class Decides(TransactionChecker):
    """Answers the engine's checks of half messages left undecided: commits those marked so."""

    def __init__(self) -> None:
        self.checked: list[bytes] = []
        self.changed = threading.Condition()

    def check(self, message: Message) -> TransactionResolution:
        with self.changed:
            self.checked.append(message.body)
            self.changed.notify_all()
        return TransactionResolution.COMMIT if message.body.startswith(b"commit") else TransactionResolution.ROLLBACK

    def wait_checked(self, count: int, *, timeout_s: float) -> list[bytes]:
        """The bodies checked, once there are ``count`` (the checks of two halves come one by one)."""
        with self.changed:
            self.changed.wait_for(lambda: len(self.checked) >= count, timeout=timeout_s)
            return sorted(self.checked)


@pytest.mark.slow  # 11 s: the default run stays within its 10 minutes
def test_transactions_commit_roll_back_and_are_decided_by_the_checker_when_left_open(
        grpc_engine: EngineProcess) -> None:
    topic = "py-tx"
    create(grpc_engine, topic)
    checker = Decides()
    transactional = Producer(official(grpc_engine), (topic,), checker)
    transactional.startup()
    try:
        for body, decide in ((b"committed", "commit"), (b"rolled back", "rollback"), (b"commit-on-check", None),
                             (b"drop-on-check", None)):
            transaction = transactional.begin_transaction()
            receipt = transactional.send(message(topic, body), transaction)
            assert receipt.transaction_id
            if decide == "commit":
                transaction.commit()
            elif decide == "rollback":
                transaction.rollback()
        consumer = SimpleConsumer(official(grpc_engine), "py-tx-g", {topic: FilterExpression()})
        consumer.startup()
        try:
            got = receive_all(consumer, 2)
            assert sorted(m.body for m in got) == [b"commit-on-check", b"committed"]
            for m in got:
                consumer.ack(m)
            assert checker.wait_checked(2, timeout_s=20) == [b"commit-on-check", b"drop-on-check"]
            assert consumer.receive(32, 20) == []
        finally:
            consumer.shutdown()
    finally:
        transactional.shutdown()


@pytest.fixture
def stub(grpc_engine: EngineProcess) -> Iterator[MessagingServiceStub]:
    with grpc.insecure_channel(grpc_engine.config.grpc_endpoint) as channel:
        yield MessagingServiceStub(channel)


def test_unknown_topics_bad_names_and_bad_handles_get_the_api_status_codes(
        grpc_engine: EngineProcess, stub: MessagingServiceStub) -> None:
    def route(topic: str) -> int:
        return stub.QueryRoute(service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name=topic)),
                               timeout=10).status.code

    create(grpc_engine, "py-codes")
    assert route("py-codes") == Code.OK
    assert route("bad topic!") == Code.ILLEGAL_TOPIC
    group = definition_pb2.Resource(name="bad group!")
    topic = definition_pb2.Resource(name="py-codes")
    assert stub.Heartbeat(service_pb2.HeartbeatRequest(group=group), timeout=10).status.code == \
        Code.ILLEGAL_CONSUMER_GROUP
    ack = stub.AckMessage(service_pb2.AckMessageRequest(
        group=definition_pb2.Resource(name="g"), topic=topic,
        entries=[service_pb2.AckMessageEntry(message_id="x", receipt_handle="not-a-handle"),
                 service_pb2.AckMessageEntry(message_id="y", receipt_handle="0:0:1:0000")]), timeout=10)
    assert ack.status.code == Code.INVALID_RECEIPT_HANDLE
    assert [e.status.code for e in ack.entries] == [Code.INVALID_RECEIPT_HANDLE] * 2
    end = stub.EndTransaction(service_pb2.EndTransactionRequest(topic=topic, transaction_id="not-an-id",
                                                                resolution=definition_pb2.COMMIT), timeout=10)
    assert end.status.code == Code.ILLEGAL_MESSAGE_ID
    unknown = stub.EndTransaction(service_pb2.EndTransactionRequest(
        topic=topic, transaction_id="7F0000010000DF4D00000000FFFFFFFF", resolution=definition_pb2.COMMIT), timeout=10)
    assert unknown.status.code == Code.INVALID_TRANSACTION_ID
    for negative in ("7F00000100004DF3FFFFFFFFFFFFFFFF", "7F00000100004DF38000000000000000"):  # offsets below 0
        end = stub.EndTransaction(service_pb2.EndTransactionRequest(
            topic=topic, transaction_id=negative, resolution=definition_pb2.COMMIT), timeout=10)
        assert end.status.code == Code.INVALID_TRANSACTION_ID
    responses = list(stub.ReceiveMessage(service_pb2.ReceiveMessageRequest(
        group=definition_pb2.Resource(name="g"), message_queue=definition_pb2.MessageQueue(topic=topic),
        batch_size=1, filter_expression=definition_pb2.FilterExpression(type=definition_pb2.SQL, expression="a>1"),
        invisible_duration={"seconds": 10}), timeout=10))
    assert [r.status.code for r in responses] == [Code.UNSUPPORTED]


def test_without_auto_create_an_unknown_topic_is_topic_not_found(store_dir: Any) -> None:
    from tests.grpc.conftest import grpc_config

    with EngineProcess(store_dir, config=grpc_config(auto_create_topic=False)) as engine, \
            grpc.insecure_channel(engine.config.grpc_endpoint) as channel:
        reply = MessagingServiceStub(channel).QueryRoute(
            service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name="nobody-made-me")), timeout=10)
        assert reply.status.code == Code.TOPIC_NOT_FOUND
