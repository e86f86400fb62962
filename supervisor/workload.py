"""A verifiable workload for fault injection: producers, and a checker of what survived.

Every body is a function of its (producer, seq) id, so integrity is checked
without keeping payloads: ``b"<producer>:<seq>:" + sha256-derived bytes``.
The checker follows Kafka's produce-consume-validate and OpenChaos's queue
checker: every acknowledged message must be read back exactly once, in its
queue, at the queue offset it was acknowledged with, with an intact body;
storage duplicates, holes and order violations are counted separately.
Messages whose send failed or timed out are "unknown": they may or may not
be stored, and either is correct.
"""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from engine.client import ClientError, EngineError, StoreClient

MessageId = tuple[str, int]  # (producer, seq)


def make_body(producer: str, seq: int, size: int) -> bytes:
    prefix = f"{producer}:{seq}:".encode()
    digest = hashlib.sha256(prefix).digest()
    filler = (digest * (size // len(digest) + 1))[: max(0, size - len(prefix))]
    return prefix + filler


def parse_body(body: bytes) -> MessageId | None:
    """The id a body claims, if its bytes are exactly what ``make_body`` makes for it."""
    parts = body.split(b":", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    producer, seq = parts[0].decode(errors="replace"), int(parts[1])
    return (producer, seq) if make_body(producer, seq, len(body)) == body else None


@dataclass
class Producer:
    """Sends batches to explicit queues and records what was acknowledged."""

    name: str
    client: StoreClient
    topics: dict[str, int]  # topic -> queue count
    rng: random.Random
    body_sizes: tuple[int, ...] = (64, 256, 1024)
    batch_size: int = 10
    next_seq: int = 0
    acked: dict[MessageId, tuple[str, int, int]] = field(default_factory=dict)
    acked_log_offsets: dict[MessageId, int] = field(default_factory=dict)
    unknown: set[MessageId] = field(default_factory=set)
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def send_batch(self) -> int:
        """One batch to a random queue; returns how many messages were acknowledged."""
        topic = self.rng.choice(sorted(self.topics))
        queue_id = self.rng.randrange(self.topics[topic])
        ids = [(self.name, self.next_seq + i) for i in range(self.batch_size)]
        self.next_seq += self.batch_size
        batch: list[dict[str, Any]] = [
            {"body": make_body(p, s, self.rng.choice(self.body_sizes)), "keys": [f"{p}-{s}"], "tags": f"t{s % 3}"}
            for p, s in ids]
        try:
            results = self.client.send(topic, batch, queue_id=queue_id)
        except EngineError as exc:
            self.errors[exc.name] += 1
            self.unknown.update(ids)
            return 0
        except ClientError:
            self.errors["TIMEOUT"] += 1
            self.unknown.update(ids)
            return 0
        acked = 0
        for message_id, result in zip(ids, results, strict=True):
            if result["status"] == "PUT_OK":
                self.acked[message_id] = (topic, queue_id, result["queue_offset"])
                self.acked_log_offsets[message_id] = result["commit_log_offset"]
                acked += 1
            else:
                self.errors[result["status"]] += 1
                self.unknown.add(message_id)
        return acked


@dataclass
class QueueRead:
    messages: list[dict[str, Any]] = field(default_factory=list)
    holes: list[int] = field(default_factory=list)  # queue offsets refused as MESSAGE_CORRUPT


def _pull(client: StoreClient, topic: str, queue_id: int, offset: int, *, deadline: float) -> dict[str, Any]:
    """A pull that retries while the engine answers SERVICE_NOT_AVAILABLE (an actor restarting)."""
    import time

    while True:
        try:
            return client.pull(topic, queue_id, offset, max_messages=256)
        except EngineError as exc:
            if exc.name != "SERVICE_NOT_AVAILABLE" or time.monotonic() > deadline:
                raise


def read_everything(client: StoreClient, topics: dict[str, int], *,
                    retry_s: float = 30.0) -> dict[tuple[str, int], QueueRead]:
    """Pull every queue from its min offset to its end."""
    import time

    deadline = time.monotonic() + retry_s
    found: dict[tuple[str, int], QueueRead] = {}
    for topic, queue_count in topics.items():
        for queue_id in range(queue_count):
            read = found[(topic, queue_id)] = QueueRead()
            offset = 0
            for _ in range(1_000_000):
                try:
                    reply = _pull(client, topic, queue_id, offset, deadline=deadline)
                except EngineError as exc:
                    if exc.name != "MESSAGE_CORRUPT":
                        raise
                    read.holes.append(offset)
                    offset += 1
                    continue
                if reply["status"] == "OFFSET_TOO_SMALL":
                    offset = reply["next_offset"]
                    continue
                if reply["status"] != "FOUND":
                    break
                read.messages.extend(reply["messages"])
                offset = reply["next_offset"]
    return found


@dataclass
class Verdict:
    acked: int = 0
    read: int = 0
    lost: list[MessageId] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    storage_duplicates: list[MessageId] = field(default_factory=list)
    misplaced: list[str] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)
    holes: list[str] = field(default_factory=list)
    unknown_stored: int = 0

    def ok(self, *, lost_allowed: int = 0) -> bool:
        return (len(self.lost) <= lost_allowed and not self.corrupt and not self.storage_duplicates
                and not self.misplaced and not self.order_violations and not self.holes)

    def summary(self) -> str:
        return (f"acked={self.acked} read={self.read} lost={len(self.lost)} corrupt={len(self.corrupt)} "
                f"storage_duplicates={len(self.storage_duplicates)} misplaced={len(self.misplaced)} "
                f"order_violations={len(self.order_violations)} holes={len(self.holes)} "
                f"unknown_stored={self.unknown_stored}")


def verify(producers: list[Producer], read: dict[tuple[str, int], QueueRead]) -> Verdict:
    verdict = Verdict()
    acked: dict[MessageId, tuple[str, int, int]] = {}
    for producer in producers:
        acked.update(producer.acked)
    verdict.acked = len(acked)
    seen: dict[MessageId, int] = {}
    for (topic, queue_id), queue in read.items():
        verdict.holes += [f"{topic}/{queue_id}@{offset}" for offset in queue.holes]
        last_seq: dict[str, int] = {}
        for expected_offset, message in enumerate(queue.messages, start=queue.messages[0]["queue_offset"]
                                                  if queue.messages else 0):
            where = f"{topic}/{queue_id}@{message['queue_offset']}"
            verdict.read += 1
            message_id = parse_body(message["body"])
            if message_id is None:
                verdict.corrupt.append(where)
                continue
            if message_id in seen:
                verdict.storage_duplicates.append(message_id)
            seen[message_id] = 1
            if message["queue_offset"] != expected_offset and not queue.holes:
                verdict.order_violations.append(f"{where}: expected offset {expected_offset}")
            producer, seq = message_id
            if last_seq.get(producer, -1) >= seq:
                verdict.order_violations.append(f"{where}: {producer} seq {seq} after {last_seq[producer]}")
            last_seq[producer] = seq
            if message_id in acked and acked[message_id] != (topic, queue_id, message["queue_offset"]):
                verdict.misplaced.append(f"{message_id} acked at {acked[message_id]}, read at {where}")
            if message_id not in acked:
                verdict.unknown_stored += 1
    verdict.lost = sorted(set(acked) - set(seen))
    return verdict


class ProducerThread:
    """Runs a Producer in a background thread until stopped; tests wait on its progress."""

    def __init__(self, producer: Producer) -> None:
        import threading

        self.producer = producer
        self._stop = threading.Event()
        self._progress = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"producer-{producer.name}", daemon=True)
        self.failure: BaseException | None = None

    def start(self) -> ProducerThread:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.producer.send_batch()
                with self._progress:
                    self._progress.notify_all()
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread by wait_acked/stop
            self.failure = exc
            with self._progress:
                self._progress.notify_all()

    @property
    def acked(self) -> int:
        return len(self.producer.acked)

    def wait_acked(self, count: int, *, timeout_s: float = 60.0) -> None:
        """Block until at least ``count`` messages were acknowledged (or raise at the deadline)."""
        with self._progress:
            ok = self._progress.wait_for(lambda: self.acked >= count or self.failure is not None, timeout_s)
        if self.failure is not None:
            raise RuntimeError("the producer failed") from self.failure
        if not ok:
            raise TimeoutError(f"only {self.acked} of {count} messages acknowledged within {timeout_s} s "
                               f"(errors: {dict(self.producer.errors)})")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        if self.failure is not None:
            raise RuntimeError("the producer failed") from self.failure


def wait_dispatched(client: StoreClient, timeout_ms: int = 10_000) -> dict[str, int]:
    """Block until every owner and the index applied all the writer confirmed (deadline, no sleep)."""
    import time

    deadline = time.monotonic() + timeout_ms / 1000
    offsets: dict[str, int] = {}
    while time.monotonic() < deadline:
        try:
            offsets = client.status()["offsets"]
        except EngineError as exc:
            if exc.name != "SERVICE_NOT_AVAILABLE":
                raise
            continue
        confirmed = offsets["confirmed_offset"]
        if all(v >= confirmed for k, v in offsets.items() if k.endswith("applied_offset")):
            return offsets
    raise TimeoutError(f"dispatch did not catch up within {timeout_ms} ms: {offsets}")
