"""Traffic through the gRPC endpoint for the chaos run: the official RocketMQ 5 Python producer
sends to ``GRPC_TOPIC`` all along, whatever is being killed, and keeps the id of every message
it got a receipt for. At the end each of them must be in the topic (``missing_receipts``)."""

from __future__ import annotations

import logging
import threading

from engine.client import StoreClient
from harness.workload import read_everything
from supervisor.launcher import EngineProcess

GRPC_TOPIC, GRPC_QUEUES = "chaos-grpc", 2


class GrpcSender(threading.Thread):
    def __init__(self, engine: EngineProcess, name: str) -> None:
        super().__init__(name=f"grpc-{name}", daemon=True)
        self.engine = engine
        self.prefix = name
        self.receipts: set[str] = set()
        self.failures = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        from rocketmq import ClientConfiguration, Credentials, Message, Producer

        logging.getLogger("rocketmq-python-client").setLevel(logging.CRITICAL)  # refusals while actors die
        producer = Producer(ClientConfiguration(self.engine.config.grpc_endpoint, Credentials(), request_timeout=3),
                            (GRPC_TOPIC,))
        producer.startup()
        try:
            n = 0
            while not self.stop_event.is_set():
                message = Message()
                message.topic, message.body = GRPC_TOPIC, f"{self.prefix}-{n}".encode()
                try:
                    self.receipts.add(producer.send(message).message_id)
                    n += 1
                except Exception:  # a kill under way: the outcome is unknown, the next send goes on
                    self.failures += 1
                    self.stop_event.wait(0.05)
        finally:
            producer.shutdown()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(60)


def missing_receipts(client: StoreClient, senders: list[GrpcSender]) -> list[str]:
    """Ids the producers were given a receipt for that the topic does not hold."""
    stored = {m["uniq_key"] for queue in read_everything(client, {GRPC_TOPIC: GRPC_QUEUES}).values()
              for m in queue.messages}
    return sorted(set().union(*(s.receipts for s in senders)) - stored)
