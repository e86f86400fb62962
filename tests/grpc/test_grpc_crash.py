"""SIGKILL of the gRPC endpoint while the official Python producer and simple consumer use it.

The clients reconnect by themselves once the supervisor has restarted the actor; every
message the producer got a receipt for is received and acked in the end, and no message
whose ack succeeded is delivered again."""

from __future__ import annotations

import threading
import time

import pytest
from rocketmq import FilterExpression, Message, Producer, SimpleConsumer

from engine.ipc.control import EventStream
from harness.faults import kill_actor
from supervisor.launcher import EngineProcess
from tests.grpc.conftest import official

pytestmark = pytest.mark.timeout(180)

TOPIC, GROUP = "grpc-crash", "grpc-crash-g"
MESSAGES = 300


class Traffic:
    """A producer thread and a consumer thread, and what each saw."""

    def __init__(self, engine: EngineProcess) -> None:
        self.producer = Producer(official(engine), (TOPIC,))
        self.consumer = SimpleConsumer(official(engine), GROUP, {TOPIC: FilterExpression()}, await_duration=1)
        self.receipts: set[str] = set()
        self.acked: set[str] = set()
        self.ack_unknown: set[str] = set()  # the ack's reply was lost: done or not, the engine knows
        self.delivered_after_ack: list[str] = []
        self.errors = 0
        self.stop = threading.Event()
        self.progress = threading.Condition()
        self.threads = [threading.Thread(target=self.produce, daemon=True),
                        threading.Thread(target=self.consume, daemon=True)]

    def start(self) -> None:
        self.producer.startup()
        self.consumer.startup()
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
        self.producer.shutdown()
        self.consumer.shutdown()

    def produce(self) -> None:
        n = 0
        while n < MESSAGES and not self.stop.is_set():
            message = Message()
            message.topic, message.body = TOPIC, b"m-%04d" % n
            try:
                receipt = self.producer.send(message)
            except Exception:  # the endpoint is down: try again (a new id; the old may be stored too)
                self.errors += 1
                self.stop.wait(0.1)
                continue
            self.receipts.add(receipt.message_id)
            n += 1

    def consume(self) -> None:
        while not self.stop.is_set():
            try:
                messages = self.consumer.receive(16, 3)
            except Exception:
                self.errors += 1
                self.stop.wait(0.1)
                continue
            for message in messages:
                if message.message_id in self.acked:
                    self.delivered_after_ack.append(message.message_id)
                try:
                    self.consumer.ack(message)
                except Exception:  # unknown outcome: it may come back, and that is allowed
                    self.errors += 1
                    self.ack_unknown.add(message.message_id)
                    continue
                with self.progress:
                    self.acked.add(message.message_id)
                    self.progress.notify_all()

    def wait_acked(self, count: int, timeout_s: float) -> bool:
        with self.progress:
            return self.progress.wait_for(lambda: len(self.acked) >= count, timeout_s)

    def wait_all_done(self, engine: EngineProcess, timeout_s: float) -> bool:
        """Every receipted message acked, or its ack's outcome unknown, and the engine's ack state
        says every stored message of the topic is done."""
        deadline = time.monotonic() + timeout_s
        with engine.client() as client:
            while time.monotonic() < deadline:
                with self.progress:
                    accounted = len(self.receipts) == MESSAGES and self.receipts <= self.acked | self.ack_unknown
                    if not accounted:
                        self.progress.wait(0.2)
                        continue
                stats = [client.pop_stats(GROUP, TOPIC, q) for q in range(4)]
                if all(s["ack_floor"] == s["max_offset"] for s in stats):
                    return True
                with self.progress:
                    self.progress.wait(0.2)
        return False


@pytest.mark.slow  # 6 s of kills under load
def test_clients_ride_through_kills_of_the_grpc_endpoint_and_no_acked_message_comes_back(
        own_engine: EngineProcess) -> None:
    with own_engine.client() as client:
        client.create_topic(TOPIC, queue_count=4)
    traffic = Traffic(own_engine)
    traffic.start()
    try:
        for round_ in range(2):
            assert traffic.wait_acked((round_ + 1) * 80, 60), f"stuck at {len(traffic.acked)} acks"
            events = EventStream(own_engine.store_dir)
            name, _pid = kill_actor(own_engine.store_dir, "grpc")
            assert events.wait_for("actor.exited", name=name).exit_code == -9
            events.wait_for("recovery.done", name=name)
            events.close()
        assert traffic.wait_all_done(own_engine, 90), (len(traffic.receipts), len(traffic.receipts - traffic.acked))
    finally:
        traffic.close()
    assert traffic.delivered_after_ack == []
