"""Sends and receive + ack through the gRPC endpoint, beside the same work over the ZeroMQ protocol.

    .venv/bin/python scripts/bench_grpc.py [--messages 3000] [--reps 3]

One engine (ASYNC_FLUSH, gRPC on), one topic of 8 queues, 256-byte bodies, one client thread
per figure. Each figure is the median of ``--reps`` runs; sends also give their latency
percentiles. The pairs:

* send, batch 1: the official Python client's ``Producer.send``, one message per call, against
  ``StoreClient.send`` of one message;
* send, batch 32: one ``SendMessageRequest`` of 32 messages through the generated stub (the
  official Python client sends one message per request; the API takes batches), against
  ``StoreClient.send`` of 32; and the official client with 32 sends in flight
  (``send_async``);
* receive + ack: the official ``SimpleConsumer.receive(32)`` and an ``ack`` per message, 8 at
  a time from a thread pool (the client acks one message a call, and its ``ack_async`` in
  5.1.2 returns no future to wait on), against ``StoreClient.pop(32)`` and one ``ack`` of the
  32.

Beside each send figure it prints the CPU time each process spent per call (this client
process included), from one more run: what bounds the gRPC path, process by process.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc
import psutil
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2, service_pb2
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from engine.config import StoreConfig
from harness.faults import actor_pids
from harness.workload import wait_dispatched
from supervisor.launcher import EngineProcess, free_port

BODY = b"x" * 256
QUEUES = 8


def median_rate(runs: list[tuple[int, float]]) -> float:
    return statistics.median(count / seconds for count, seconds in runs)


def percentiles(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p50, p99 = ordered[len(ordered) // 2], ordered[int(len(ordered) * 0.99)]
    return f"p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms"


def timed(work: Callable[[], int]) -> tuple[int, float]:
    started = time.perf_counter()
    count = work()
    return count, time.perf_counter() - started


def cpu_per_call(store_dir: Path, work: Callable[[], int], calls_per_run: int) -> str:
    """One run of ``work``: the CPU time (user + system) of each process per call, largest first."""
    processes = {"client": psutil.Process(), **{name: psutil.Process(pid)
                                                for name, pid in actor_pids(store_dir).items()}}

    def cpu() -> dict[str, float]:
        return {name: sum(process.cpu_times()[:2]) for name, process in processes.items()}

    before = cpu()
    work()
    spent = {name: (seconds - before[name]) / calls_per_run * 1e3 for name, seconds in cpu().items()}
    return ", ".join(f"{name} {ms:.2f}" for name, ms in sorted(spent.items(), key=lambda kv: -kv[1]) if ms >= 0.01)


def official_message(topic: str) -> Message:
    m = Message()
    m.topic, m.body = topic, BODY
    return m


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=3000, help="messages per run")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    n, reps = args.messages, args.reps
    config = StoreConfig().replace(grpc_enabled=True, grpc_endpoint=f"127.0.0.1:{free_port()}",
                                   segment_size_bytes=256 * 1024 * 1024)
    with tempfile.TemporaryDirectory() as workdir, EngineProcess(Path(workdir) / "store", config=config) as engine:
        store_dir = Path(workdir) / "store"
        target = engine.config.grpc_endpoint
        official = ClientConfiguration(target, Credentials(), request_timeout=10)
        client = engine.client()
        client.create_topic("zmq", queue_count=QUEUES)
        client.create_topic("grpc", queue_count=QUEUES)
        results: dict[str, float] = {}
        ackers = ThreadPoolExecutor(8)

        # send, batch 1
        zmq_lat: list[float] = []
        grpc_lat: list[float] = []

        def zmq_one() -> int:
            for _ in range(n):
                t = time.perf_counter()
                client.send("zmq", [{"body": BODY}])
                zmq_lat.append(time.perf_counter() - t)
            return n

        producer = Producer(official, ("grpc",))
        producer.startup()

        def grpc_one() -> int:
            for _ in range(n):
                t = time.perf_counter()
                producer.send(official_message("grpc"))
                grpc_lat.append(time.perf_counter() - t)
            return n

        results["zmq send b1"] = median_rate([timed(zmq_one) for _ in range(reps)])
        results["grpc send b1 (official client)"] = median_rate([timed(grpc_one) for _ in range(reps)])
        print(f"send, batch 1: ZeroMQ {results['zmq send b1']:,.0f} msg/s ({percentiles(zmq_lat)}); "
              f"gRPC, official client {results['grpc send b1 (official client)']:,.0f} msg/s "
              f"({percentiles(grpc_lat)})", flush=True)
        print(f"  CPU ms per send, ZeroMQ: {cpu_per_call(store_dir, zmq_one, n)}", flush=True)
        print(f"  CPU ms per send, gRPC: {cpu_per_call(store_dir, grpc_one, n)}", flush=True)

        # send, batch 32
        def zmq_batch() -> int:
            for _ in range(n // 32):
                client.send("zmq", [{"body": BODY}] * 32)
            return n // 32 * 32

        channel = grpc.insecure_channel(target)
        stub = MessagingServiceStub(channel)
        counter = iter(range(10**9))

        def grpc_batch() -> int:
            for _ in range(n // 32):
                request = service_pb2.SendMessageRequest(messages=[definition_pb2.Message(
                    topic=definition_pb2.Resource(name="grpc"), body=BODY,
                    system_properties=definition_pb2.SystemProperties(message_id=f"01B{next(counter):031X}"))
                    for _ in range(32)])
                reply = stub.SendMessage(request, timeout=10)
                assert reply.status.code == 20000, reply.status
            return n // 32 * 32

        def official_in_flight() -> int:
            for _ in range(n // 32):
                futures = [producer.send_async(official_message("grpc")) for _ in range(32)]
                for future in futures:
                    future.result(timeout=10)
            return n // 32 * 32

        results["zmq send b32"] = median_rate([timed(zmq_batch) for _ in range(reps)])
        results["grpc send b32 (stub)"] = median_rate([timed(grpc_batch) for _ in range(reps)])
        results["grpc send 32 in flight (official client)"] = median_rate([timed(official_in_flight)
                                                                          for _ in range(reps)])
        print(f"send, batch 32: ZeroMQ {results['zmq send b32']:,.0f} msg/s; gRPC request of 32 "
              f"{results['grpc send b32 (stub)']:,.0f} msg/s; official client, 32 in flight "
              f"{results['grpc send 32 in flight (official client)']:,.0f} msg/s", flush=True)
        print(f"  CPU ms per request of 32, ZeroMQ: {cpu_per_call(store_dir, zmq_batch, n // 32)}", flush=True)
        print(f"  CPU ms per request of 32, gRPC: {cpu_per_call(store_dir, grpc_batch, n // 32)}", flush=True)
        producer.shutdown()
        channel.close()
        wait_dispatched(client)

        # receive + ack (each run takes n messages of what the sends stored)
        def zmq_pop(group: str) -> Callable[[], int]:
            def run() -> int:
                taken = 0
                while taken < n:
                    messages = client.pop(group, "zmq", max_messages=32, invisible_ms=60_000)
                    client.ack(group, messages)
                    taken += len(messages)
                return taken
            return run

        def grpc_receive(group: str) -> Callable[[], int]:
            consumer = SimpleConsumer(official, group, {"grpc": FilterExpression()}, await_duration=1)
            consumer.startup()

            def run() -> int:
                taken = 0
                try:
                    while taken < n:
                        messages = consumer.receive(32, 60)
                        list(ackers.map(consumer.ack, messages))
                        taken += len(messages)
                finally:
                    consumer.shutdown()
                return taken
            return run

        results["zmq pop+ack"] = median_rate([timed(zmq_pop(f"zg{r}")) for r in range(reps)])
        results["grpc receive+ack (official client)"] = median_rate([timed(grpc_receive(f"gg{r}"))
                                                                    for r in range(reps)])
        print(f"receive + ack: ZeroMQ pop(32) + ack {results['zmq pop+ack']:,.0f} msg/s; gRPC, official "
              f"SimpleConsumer {results['grpc receive+ack (official client)']:,.0f} msg/s", flush=True)
        client.close()
    print("ratios (ZeroMQ / gRPC): send b1 {:.2f}, send b32 {:.2f}, receive+ack {:.2f}".format(
        results["zmq send b1"] / results["grpc send b1 (official client)"],
        results["zmq send b32"] / results["grpc send b32 (stub)"],
        results["zmq pop+ack"] / results["grpc receive+ack (official client)"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
