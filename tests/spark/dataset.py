"""The messages every Spark test store holds, and helpers to read them back through the engine.

``orders`` (4 queues) gets batches before and after a burst of ``burst``
(2 queues), so that the burst lands in a few segments only and a filter on
it can prune the rest. Bodies are random bytes of varied sizes; keys,
tags, flags and properties (some non-ASCII) vary by message.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field
from typing import Any

from engine.client import StoreClient
from tests.helpers import wait_dispatched

DATASET_TOPICS = {"orders": 4, "burst": 2}
ORDERS_BEFORE, BURST, ORDERS_AFTER = 600, 60, 600
BATCH = 20


@dataclass
class Sent:
    results: list[dict[str, Any]] = field(default_factory=list)  # send results, in send order
    burst_first_ms: int = 0  # store time of the first burst message
    burst_last_ms: int = 0

    def count(self, topic: str) -> int:
        return sum(1 for r in self.results if r["topic"] == topic)


def make_message(rng: random.Random, topic: str, n: int) -> dict[str, Any]:
    size = rng.choice((1, 40, 700, 1500, 3000))
    message: dict[str, Any] = {"body": rng.randbytes(size), "keys": [f"{topic}-{n}", f"group-{n % 13}"],
                               "properties": {"seq": str(n), "note": "ünïcødé ✓" if n % 2 else "plain"},
                               "flag": n % 3}
    if n % 4:
        message["tags"] = f"tag{n % 5}"
    return message


def send_batches(client: StoreClient, rng: random.Random, topic: str, count: int, sent: Sent, *,
                 queue_count: int, first: int = 0) -> None:
    for start in range(first, first + count, BATCH):
        batch = [make_message(rng, topic, n) for n in range(start, min(first + count, start + BATCH))]
        queue_id = None if (start // BATCH) % 3 == 0 else (start // BATCH) % queue_count
        results = client.send(topic, batch, queue_id=queue_id)
        assert [r["status"] for r in results] == ["PUT_OK"] * len(batch)
        sent.results += [{**r, "topic": topic} for r in results]


def send_dataset(client: StoreClient, *, seed: int) -> Sent:
    rng = random.Random(seed)
    sent = Sent()
    for topic, queues in DATASET_TOPICS.items():
        client.create_topic(topic, queue_count=queues)
    send_batches(client, rng, "orders", ORDERS_BEFORE, sent, queue_count=4)
    send_batches(client, rng, "burst", BURST, sent, queue_count=2)
    burst = [r for r in sent.results if r["topic"] == "burst"]
    sent.burst_first_ms, sent.burst_last_ms = burst[0]["store_timestamp"], burst[-1]["store_timestamp"]
    send_batches(client, rng, "orders", ORDERS_AFTER, sent, queue_count=4, first=ORDERS_BEFORE)
    wait_dispatched(client)
    return sent


def pull_all(client: StoreClient, topic: str, queue_id: int) -> list[dict[str, Any]]:
    """Every message of a queue, as the engine serves it (deadline: the client's own timeouts)."""
    messages: list[dict[str, Any]] = []
    offset = 0
    for _ in range(100_000):
        reply = client.pull(topic, queue_id, offset, max_messages=256)
        if reply["status"] != "FOUND":
            assert reply["status"] in ("OFFSET_OVERFLOW_ONE", "NO_MESSAGE_IN_QUEUE"), reply["status"]
            return messages
        messages += reply["messages"]
        offset = reply["next_offset"]
    raise AssertionError("the queue never ended")


def pull_topics(client: StoreClient, topics: dict[str, int]) -> dict[tuple[str, int, int], dict[str, Any]]:
    """(topic, queue_id, queue_offset) -> message object, for every queue of ``topics``."""
    return {(m["topic"], m["queue_id"], m["queue_offset"]): m
            for topic, queues in topics.items() for q in range(queues) for m in pull_all(client, topic, q)}


def as_message(row: Any) -> dict[str, Any]:
    """A Spark row of MESSAGE_SCHEMA in the shape of the engine's message object (timestamps in ms)."""
    values = row.asDict()
    for name in ("born_timestamp", "store_timestamp"):
        values[name] = epoch_ms(values[name])
    values["body"] = bytes(values["body"]) if values["body"] is not None else None
    return values


def epoch_ms(value: dt.datetime) -> int:
    """PySpark hands timestamps back as naive local datetimes; ``timestamp()`` reads them the same way."""
    return round(value.timestamp() * 1000)


def rows_by_position(rows: list[Any]) -> dict[tuple[str, int, int], dict[str, Any]]:
    found: dict[tuple[str, int, int], dict[str, Any]] = {}
    for row in rows:
        message = as_message(row)
        key = (message["topic"], message["queue_id"], message["queue_offset"])
        assert key not in found, f"{key} read twice"
        found[key] = message
    return found
