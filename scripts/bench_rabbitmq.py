"""RabbitMQ on this machine, as the reference for pop consumers: publish, then consume with manual acks.

    rabbitmq-server -detached && rabbitmqctl await_startup      # Debian: apt-get install rabbitmq-server
    python scripts/bench_rabbitmq.py                             # quorum queue, 200,000 messages of 256 B
    python scripts/bench_rabbitmq.py --classic --messages 100000

It declares a durable queue (quorum by default, classic with ``--classic``) through the
AMQP 0-9-1 client ``pika`` (``pip install pika``; not a dependency of the engine), publishes
the messages persistent (waiting until the queue holds them all), then consumes them with
manual acks from ``--consumers`` processes (each its own connection, so the Python client is
not the limit): prefetch 32, one ``basic.ack(multiple=True)`` per 32 deliveries (the
engine's pop+ack batch), and, with ``--ack-each``, one ack per message. It prints msg/s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from multiprocessing import Event, Process

try:
    import pika
except ImportError:  # pragma: no cover - a reference tool, not a dependency
    raise SystemExit("this benchmark needs pika: pip install pika") from None

BATCH = 32


def connect(host: str) -> pika.BlockingConnection:
    try:
        return pika.BlockingConnection(pika.ConnectionParameters(host=host, heartbeat=0))
    except pika.exceptions.AMQPConnectionError as exc:
        raise SystemExit(f"RabbitMQ is not reachable on {host}:5672 ({exc!r}); start it with "
                         f"`rabbitmq-server -detached && rabbitmqctl await_startup`") from None


def declare(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str, *, classic: bool) -> None:
    channel.queue_delete(queue=queue)
    arguments = {} if classic else {"x-queue-type": "quorum"}
    channel.queue_declare(queue=queue, durable=True, arguments=arguments)


def publish(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str, count: int, body: bytes) -> float:
    """Persistent messages, without confirms; done when the queue holds them all."""
    properties = pika.BasicProperties(delivery_mode=2)
    started = time.perf_counter()
    for _ in range(count):
        channel.basic_publish(exchange="", routing_key=queue, body=body, properties=properties)
    channel.queue_declare(queue=queue, passive=True)  # a round trip: every publish before it was routed
    while channel.queue_declare(queue=queue, passive=True).method.message_count < count:
        channel.connection.process_data_events(time_limit=0.05)
    return count / (time.perf_counter() - started)


def consume_part(host: str, queue: str, count: int, ack_each: bool, start: Event) -> None:
    """One consumer process: its own connection and channel, ``count`` messages."""
    connection = connect(host)
    channel = connection.channel()
    start.wait()
    consume(channel, queue, count, ack_each=ack_each)
    connection.close()


def consume_all(host: str, queue: str, count: int, *, consumers: int, ack_each: bool) -> float:
    start = Event()
    parts = [Process(target=consume_part, args=(host, queue, count // consumers + (i < count % consumers), ack_each,
                                               start)) for i in range(consumers)]
    for part in parts:
        part.start()
    time.sleep(0.5)  # let every consumer connect before the clock starts (a benchmark, not a test)
    started = time.perf_counter()
    start.set()
    for part in parts:
        part.join()
    return count / (time.perf_counter() - started)


def consume(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str, count: int, *,
            ack_each: bool) -> float:
    channel.basic_qos(prefetch_count=BATCH)
    started = time.perf_counter()
    for received, (method, _properties, _body) in enumerate(channel.consume(queue, auto_ack=False), start=1):
        if ack_each:
            channel.basic_ack(method.delivery_tag)
        elif received % BATCH == 0 or received == count:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if received == count:
            break
    seconds = time.perf_counter() - started
    channel.cancel()
    return count / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--body-bytes", type=int, default=256)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--classic", action="store_true", help="a classic queue instead of a quorum queue")
    parser.add_argument("--ack-each", action="store_true", help="also measure one ack per message")
    parser.add_argument("--consumers", type=int, default=4, help="consumer processes (4: more went no faster here)")
    args = parser.parse_args()
    connection = connect(args.host)
    channel = connection.channel()
    kind = "classic" if args.classic else "quorum"
    queue = f"bench-{kind}"
    body = b"x" * args.body_bytes
    modes = [False, True] if args.ack_each else [False]
    results: dict[str, list[float]] = {}
    for _ in range(args.reps):
        for ack_each in modes:
            declare(channel, queue, classic=args.classic)
            results.setdefault("publish", []).append(publish(channel, queue, args.messages, body))
            label = "consume, ack each" if ack_each else f"consume, ack per {BATCH}"
            results.setdefault(label, []).append(consume_all(args.host, queue, args.messages,
                                                             consumers=args.consumers, ack_each=ack_each))
    channel.queue_delete(queue=queue)
    connection.close()
    print(f"RabbitMQ {kind} queue, {args.messages} messages of {args.body_bytes} B, prefetch {BATCH}, "
          f"{args.consumers} consumers, {args.reps} runs", flush=True)
    for label, rates in results.items():
        print(f"rabbitmq {kind} {label:<22} {statistics.median(rates):>12,.0f} msg/s "
              f"(min {min(rates):,.0f}, max {max(rates):,.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
