"""FIFO message groups through the official Python client: a group's messages keep to one
queue, and a FIFO consumer group (``fifo_groups``) gets the next message of a queue only once
the earlier ones are acked, whichever of its consumers asks; a FIFO push consumer that gives up
on a message forwards it to the dead-letter topic and goes on with the next."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from rocketmq import ConsumeResult, FilterExpression, Message, MessageListener, Producer, PushConsumer, SimpleConsumer

from engine.names import dead_letter_topic
from supervisor.launcher import EngineProcess
from tests.grpc.conftest import grpc_config, official

pytestmark = pytest.mark.timeout(150)

FIFO_GROUP, PUSH_GROUP = "fifo-g", "fifo-push-g"
GROUPS, PER_GROUP = 6, 15


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    process = EngineProcess(tmp_path_factory.mktemp("fifo") / "store",
                            config=grpc_config(fifo_groups=(FIFO_GROUP, PUSH_GROUP)))
    process.start()
    try:
        yield process
    finally:
        process.stop()


def send_groups(engine: EngineProcess, topic: str, groups: int, per_group: int) -> None:
    """Messages "g<k>:<seq>" in message group "g<k>", interleaved; each group lands in one queue."""
    with engine.client() as client:
        client.create_topic(topic, queue_count=4)
    producer = Producer(official(engine), (topic,))
    producer.startup()
    try:
        for seq in range(per_group):
            for k in range(groups):
                m = Message()
                m.topic, m.body, m.message_group = topic, f"g{k}:{seq}".encode(), f"g{k}"
                producer.send(m)
    finally:
        producer.shutdown()
    with engine.client() as client:
        queues: dict[str, set[int]] = defaultdict(set)
        for q in range(4):
            for m in client.pull(topic, q, 0, max_messages=1024)["messages"]:
                queues[m["body"].decode().split(":")[0]].add(q)
    assert all(len(found) == 1 for found in queues.values()), queues


class Log:
    """Receive and ack events in one order, across consumers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, str, int, int]] = []  # (kind, group, seq, receive call)
        self.calls = 0
        self.acked = 0

    def received(self, messages: list[Any]) -> int:
        with self.lock:
            self.calls += 1
            for m in messages:
                group, seq = m.body.decode().split(":")
                self.events.append(("receive", group, int(seq), self.calls))
            return self.calls

    def ack(self, message: Any, call: int) -> None:
        group, seq = message.body.decode().split(":")
        with self.lock:
            self.events.append(("ack", group, int(seq), call))
            self.acked += 1


def test_three_concurrent_consumers_of_a_fifo_group_keep_each_message_group_in_order(engine: EngineProcess) -> None:
    topic = "fifo-simple"
    send_groups(engine, topic, GROUPS, PER_GROUP)
    log = Log()
    stop = threading.Event()
    consumers = [SimpleConsumer(official(engine), FIFO_GROUP, {topic: FilterExpression()}, await_duration=1)
                 for _ in range(3)]

    def work(consumer: SimpleConsumer) -> None:
        while not stop.is_set() and log.acked < GROUPS * PER_GROUP:
            messages = consumer.receive(4, 20)
            call = log.received(messages)
            for m in messages:
                log.ack(m, call)  # before the engine has it: once it has, the next of its group may be received
                consumer.ack(m)

    for consumer in consumers:
        consumer.startup()
    threads = [threading.Thread(target=work, args=(c,), daemon=True) for c in consumers]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 90
        while log.acked < GROUPS * PER_GROUP and time.monotonic() < deadline and any(t.is_alive() for t in threads):
            threads[0].join(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        for consumer in consumers:
            consumer.shutdown()
    assert log.acked == GROUPS * PER_GROUP
    acked_order: dict[str, list[int]] = defaultdict(list)
    acked: set[tuple[str, int]] = set()
    for kind, group, seq, call in log.events:
        if kind == "ack":
            acked_order[group].append(seq)
            acked.add((group, seq))
        elif seq > 0 and (group, seq - 1) not in acked:
            # only in the same receive as its predecessor (one consumer, in order) may it come early
            assert ("receive", group, seq - 1, call) in log.events, (group, seq, "before its predecessor's ack")
    assert all(order == list(range(PER_GROUP)) for order in acked_order.values()), acked_order
    assert len({call for _k, _g, _s, call in log.events}) > 3  # the consumers took turns


class GiveUpOn(MessageListener):
    def __init__(self, poison: bytes) -> None:
        self.poison = poison
        self.consumed: list[bytes] = []
        self.attempts = 0
        self.done = threading.Event()

    def consume(self, message: Any) -> ConsumeResult:
        if message.body == self.poison:
            self.attempts += 1
            return ConsumeResult.FAILURE
        self.consumed.append(message.body)
        if len(self.consumed) == 2:
            self.done.set()
        return ConsumeResult.SUCCESS


def test_a_fifo_push_consumer_forwards_a_message_it_gives_up_on_and_goes_on(engine: EngineProcess) -> None:
    topic = "fifo-push"
    send_groups(engine, topic, 1, 3)  # g0:0, g0:1, g0:2
    listener = GiveUpOn(b"g0:1")
    consumer = PushConsumer(official(engine), PUSH_GROUP, listener, {topic: FilterExpression()})
    consumer.startup()
    try:
        assert listener.done.wait(60), listener.consumed
        assert listener.consumed == [b"g0:0", b"g0:2"]
        assert listener.attempts == engine.config.max_delivery_attempts  # retried in the client, then given up
        with engine.client() as client:
            dead = client.pull(dead_letter_topic(PUSH_GROUP), 0, 0, max_wait_ms=5_000)["messages"]
        assert [m["body"] for m in dead] == [b"g0:1"]
    finally:
        consumer.shutdown()
