"""Delayed sends, and how late the timer delivers them at a given rate of due messages.

    .venv/bin/python scripts/bench_timer.py [--rates 1000,10000] [--seconds 10] [--send-messages 50000]

One engine (ASYNC_FLUSH), one topic of 4 queues, 256-byte bodies.

* delayed send: ``--send-messages`` messages, batches of 100, each batch due 10 minutes later
  (they wait in the timer log), against the same sends without a delay;
* delivery lag, for each rate R of ``--rates``: R x ``--seconds`` messages are sent ahead
  (batches of R / 100, one batch due every 10 ms), then four long-polling pulls (one a queue)
  read them back as they come. Each body carries its deliver time; the figures are how long
  after it the timer stored the message in its queue (store lag) and a consumer had it in
  hand (read lag): percentiles and the maximum. ``early`` counts deliveries before their
  time (it must be 0).
"""

from __future__ import annotations

import argparse
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.client import StoreClient
from engine.config import StoreConfig
from supervisor.launcher import EngineProcess

TOPIC, QUEUES = "bench-timer", 4
BODY = b"x" * 248
STAMP = struct.Struct(">q")  # the deliver time at the start of each body


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def send_rate(client: StoreClient, messages: int, **timing: int) -> float:
    batch = [{"body": STAMP.pack(0) + BODY} for _ in range(100)]
    started = time.perf_counter()
    for _ in range(messages // 100):
        client.send(TOPIC, batch, **timing)
    return messages / (time.perf_counter() - started)


def percentile(values: list[int], share: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def lag_run(engine: EngineProcess, rate: int, seconds: int) -> dict[str, int]:
    per_batch = max(1, rate // 100)
    batches = seconds * 100
    total = per_batch * batches
    with engine.client(timeout_ms=30_000) as client:
        start = [client.queue_stats(TOPIC, q)["max_offset"] for q in range(QUEUES)]
        first_due = wall_ms() + 3_000 + total // 50  # after the sends below are done
        for k in range(batches):
            due = first_due + k * 10
            client.send(TOPIC, [{"body": STAMP.pack(due) + BODY} for _ in range(per_batch)], deliver_at_ms=due)
    store_lags: list[int] = []
    read_lags: list[int] = []
    lock = threading.Lock()

    def read(queue_id: int) -> None:
        offset = start[queue_id]
        with engine.client(timeout_ms=30_000) as reader:
            deadline = time.monotonic() + seconds + 60 + total / 5_000
            while time.monotonic() < deadline:
                with lock:
                    if len(read_lags) >= total:
                        return
                reply = reader.pull(TOPIC, queue_id, offset, max_messages=1_024, max_wait_ms=500)
                now = wall_ms()
                if not reply["messages"]:
                    continue
                offset = reply["messages"][-1]["queue_offset"] + 1
                with lock:
                    for message in reply["messages"]:
                        due = STAMP.unpack_from(message["body"])[0]
                        store_lags.append(message["store_timestamp"] - due)
                        read_lags.append(now - due)

    readers = [threading.Thread(target=read, args=(q,)) for q in range(QUEUES)]
    for thread in readers:
        thread.start()
    for thread in readers:
        thread.join()
    return {"messages": total, "received": len(read_lags), "early": sum(1 for lag in store_lags if lag < 0),
            "store_p50": percentile(store_lags, 0.5), "store_p99": percentile(store_lags, 0.99),
            "store_max": max(store_lags), "read_p50": percentile(read_lags, 0.5),
            "read_p99": percentile(read_lags, 0.99), "read_max": max(read_lags)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="1000,10000", help="due messages per second, comma-separated")
    parser.add_argument("--seconds", type=int, default=10, help="how long each rate lasts")
    parser.add_argument("--send-messages", type=int, default=50_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        engine = EngineProcess(Path(root) / "store", config=StoreConfig(segment_size_bytes=256 * 1024 * 1024))
        engine.start()
        try:
            with engine.client(timeout_ms=30_000) as client:
                client.create_topic(TOPIC, queue_count=QUEUES)
                plain = send_rate(client, args.send_messages)
                delayed = send_rate(client, args.send_messages, delay_ms=600_000)
            print(f"send, batches of 100: plain {plain:,.0f} msg/s, delayed {delayed:,.0f} msg/s "
                  f"({delayed / plain:.2f}x)")
            for rate in (int(r) for r in args.rates.split(",")):
                figures = lag_run(engine, rate, args.seconds)
                print(f"{rate:,} due/s for {args.seconds} s ({figures['messages']:,} messages, "
                      f"{figures['received']:,} read, {figures['early']} early): store lag p50 "
                      f"{figures['store_p50']} ms, p99 {figures['store_p99']} ms, max {figures['store_max']} ms; "
                      f"read lag p50 {figures['read_p50']} ms, p99 {figures['read_p99']} ms, "
                      f"max {figures['read_max']} ms")
        finally:
            engine.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
