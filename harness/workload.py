"""A verifiable workload for fault injection: producers, and a checker of what survived.

Every body is a function of its (producer, seq) id, so integrity is checked
without keeping payloads: ``b"<producer>:<seq>:" + sha256-derived bytes``.
The checker follows Kafka's produce-consume-validate and OpenChaos's queue
checker: every acknowledged message must be read back exactly once, in its
queue, at the queue offset it was acknowledged with, with an intact body;
storage duplicates, holes and order violations are counted separately.
Messages whose send failed or timed out are "unknown": they may or may not
be stored, and either is correct.

Two ways to keep the acknowledgements and check them:

* in memory (``Producer.acked``, ``read_everything``, ``verify``): every
  acknowledged id and every body read back are held at once, fine for tests;
* on disk (``Producer(ack_log=AckLog(...))``, ``verify_streaming``): each ack is
  a fixed-size record in a file, at the position of its seq, and the checker
  walks each queue once, page by page, looking every message up in that file.
  Memory does not grow with the run: a few numbers per queue and producer, one
  pull page, and at most ``examples_max`` examples of each kind of failure.
"""

from __future__ import annotations

import hashlib
import os
import random
import struct
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
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


# One acknowledged message in an AckLog, at byte seq * size:
#
#   0        4            12                  20
#   +--------+------------+-------------------+
#   | queue  | queue      | commit log        |
#   | key u32| offset i64 | offset i64        |
#   +--------+------------+-------------------+
#
# queue key: 1 + the index of (topic, queue_id) in the log's sorted queue list; 0 (a hole
# in the sparse file) means "not acknowledged" (never sent, failed, or unknown).
ACK_RECORD = struct.Struct("<Iqq")
assert ACK_RECORD.size == 20
_SCAN_RECORDS = 4096


class AckLog:
    """The acknowledged messages of one producer, on disk: one record per seq, nothing per message in memory.

    ``<dir>/<producer>.acks`` holds the records; ``<dir>/<producer>.seen`` holds one
    byte per seq (how many times a verification read it), rewritten by each verification.
    """

    def __init__(self, directory: Path, producer: str, topics: dict[str, int]) -> None:
        assert producer.replace("-", "").replace("_", "").isalnum(), producer
        directory.mkdir(parents=True, exist_ok=True)
        self.producer = producer
        self.queues = [(topic, queue_id) for topic in sorted(topics) for queue_id in range(topics[topic])]
        self._keys = {queue: key for key, queue in enumerate(self.queues, start=1)}
        self.path = directory / f"{producer}.acks"
        self.seen_path = directory / f"{producer}.seen"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._seen_fd = os.open(self.seen_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    def record(self, seq: int, topic: str, queue_id: int, queue_offset: int, commit_log_offset: int) -> None:
        self.record_run(seq, [(topic, queue_id, queue_offset, commit_log_offset)])

    def record_run(self, first_seq: int, acks: list[tuple[str, int, int, int] | None]) -> None:
        """Record the acks of seqs ``first_seq, first_seq + 1, ...`` in one write (None: not acknowledged)."""
        assert first_seq >= 0
        packed = b"".join(ACK_RECORD.pack(0, 0, 0) if ack is None else
                          ACK_RECORD.pack(self._keys[(ack[0], ack[1])], ack[2], ack[3]) for ack in acks)
        written = os.pwrite(self._fd, packed, first_seq * ACK_RECORD.size)
        assert written == len(packed)

    def lookup(self, seq: int) -> tuple[str, int, int] | None:
        """(topic, queue_id, queue_offset) the message ``seq`` was acknowledged at, or None."""
        raw = os.pread(self._fd, ACK_RECORD.size, seq * ACK_RECORD.size)
        if len(raw) < ACK_RECORD.size:
            return None
        key, queue_offset, _commit_log_offset = ACK_RECORD.unpack(raw)
        return (*self.queues[key - 1], queue_offset) if key else None

    def reset_seen(self) -> None:
        os.ftruncate(self._seen_fd, 0)

    def mark_seen(self, seq: int) -> int:
        """Count one more read of ``seq``; returns how many times it was read before (saturates at 255)."""
        raw = os.pread(self._seen_fd, 1, seq)
        before = raw[0] if raw else 0
        os.pwrite(self._seen_fd, bytes([min(before + 1, 255)]), seq)
        return before

    def unread(self) -> Iterator[tuple[int, int]]:
        """Yields (acknowledged count so far, seq) for each acknowledged seq never read, then (total, -1)."""
        acked = 0
        seq = 0
        for _ in range(1 << 62):
            raw = os.pread(self._fd, _SCAN_RECORDS * ACK_RECORD.size, seq * ACK_RECORD.size)
            if not raw:
                break
            seen = os.pread(self._seen_fd, len(raw) // ACK_RECORD.size, seq)
            for i, (key, _queue_offset, _commit_log_offset) in enumerate(ACK_RECORD.iter_unpack(raw)):
                if key:
                    acked += 1
                    if i >= len(seen) or seen[i] == 0:
                        yield acked, seq + i
            seq += len(raw) // ACK_RECORD.size
        yield acked, -1

    def close(self) -> None:
        for fd in (self._fd, self._seen_fd):
            os.close(fd)


@dataclass
class Producer:
    """Sends batches to explicit queues and records what was acknowledged.

    With an ``ack_log`` the acks go to that file only and failed sends are only
    counted (``unknown_count``): nothing is kept per message in memory.
    """

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
    resent: set[MessageId] = field(default_factory=set)  # acknowledged after a resend: maybe stored twice
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    ack_log: AckLog | None = None
    acked_count: int = 0
    unknown_count: int = 0

    def _unknown(self, ids: list[MessageId]) -> None:
        self.unknown_count += len(ids)
        if self.ack_log is None:
            self.unknown.update(ids)

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
            self._unknown(ids)
            return 0
        except ClientError:
            self.errors["TIMEOUT"] += 1
            self._unknown(ids)
            return 0
        acked = 0
        run: list[tuple[str, int, int, int] | None] = []
        for message_id, result in zip(ids, results, strict=True):
            if result["status"] == "PUT_OK":
                run.append((topic, queue_id, result["queue_offset"], result["commit_log_offset"]))
                if self.ack_log is None:
                    self.acked[message_id] = (topic, queue_id, result["queue_offset"])
                    self.acked_log_offsets[message_id] = result["commit_log_offset"]
                    if result.get("resent"):
                        self.resent.add(message_id)
                acked += 1
            else:
                run.append(None)
                self.errors[result["status"]] += 1
                self._unknown([message_id])
        if self.ack_log is not None:
            self.ack_log.record_run(ids[0][1], run)
        self.acked_count += acked
        return acked


@dataclass
class QueueRead:
    messages: list[dict[str, Any]] = field(default_factory=list)
    holes: list[int] = field(default_factory=list)  # queue offsets refused as MESSAGE_CORRUPT


def _pull(client: StoreClient, topic: str, queue_id: int, offset: int, *, deadline: float) -> dict[str, Any]:
    """A pull that retries while the engine answers SERVICE_NOT_AVAILABLE (an actor restarting)."""
    while True:
        try:
            return client.pull(topic, queue_id, offset, max_messages=256)
        except EngineError as exc:
            if exc.name != "SERVICE_NOT_AVAILABLE" or time.monotonic() > deadline:
                raise


def _walk_queue(client: StoreClient, topic: str, queue_id: int, *, retry_s: float,
                deadline: float | None = None) -> Iterator[list[dict[str, Any]] | int]:
    """One queue from its min offset to its end: yields each page of messages, or the offset of a hole.

    A hole is a unit the engine refused as MESSAGE_CORRUPT. Retries of SERVICE_NOT_AVAILABLE
    end at ``deadline`` if given, else ``retry_s`` after the last answered pull.
    """
    offset = 0
    for _ in range(1 << 62):
        try:
            reply = _pull(client, topic, queue_id, offset,
                          deadline=deadline if deadline is not None else time.monotonic() + retry_s)
        except EngineError as exc:
            if exc.name != "MESSAGE_CORRUPT":
                raise
            yield offset
            offset += 1
            continue
        if reply["status"] == "OFFSET_TOO_SMALL":
            offset = reply["next_offset"]
            continue
        if reply["status"] != "FOUND":
            return
        yield reply["messages"]
        offset = reply["next_offset"]


def read_everything(client: StoreClient, topics: dict[str, int], *,
                    retry_s: float = 30.0) -> dict[tuple[str, int], QueueRead]:
    """Pull every queue from its min offset to its end."""
    deadline = time.monotonic() + retry_s
    found: dict[tuple[str, int], QueueRead] = {}
    for topic, queue_count in topics.items():
        for queue_id in range(queue_count):
            read = found[(topic, queue_id)] = QueueRead()
            for page in _walk_queue(client, topic, queue_id, retry_s=retry_s, deadline=deadline):
                if isinstance(page, int):
                    read.holes.append(page)
                else:
                    read.messages.extend(page)
    return found


@dataclass
class Verdict:
    acked: int = 0
    read: int = 0
    lost: list[MessageId] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    storage_duplicates: list[MessageId] = field(default_factory=list)
    resent_copies: int = 0  # first copies of messages their client sent again after a break (allowed)
    misplaced: list[str] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)
    holes: list[str] = field(default_factory=list)
    unknown_stored: int = 0
    omitted: dict[str, int] = field(default_factory=dict)  # failures counted but not kept (verify_streaming)

    def count(self, kind: str) -> int:
        """How many failures of a kind ("lost", "corrupt", ...) were found, kept or not."""
        return len(getattr(self, kind)) + self.omitted.get(kind, 0)

    def note(self, kind: str, example: Any, *, examples_max: int) -> None:
        """Count a failure, keeping it as an example while fewer than ``examples_max`` are kept."""
        kept = getattr(self, kind)
        if len(kept) < examples_max:
            kept.append(example)
        else:
            self.omitted[kind] = self.omitted.get(kind, 0) + 1

    def ok(self, *, lost_allowed: int = 0) -> bool:
        return (self.count("lost") <= lost_allowed and not self.corrupt and not self.storage_duplicates
                and not self.misplaced and not self.order_violations and not self.holes)

    def summary(self) -> str:
        return (f"acked={self.acked} read={self.read} lost={self.count('lost')} corrupt={self.count('corrupt')} "
                f"storage_duplicates={self.count('storage_duplicates')} misplaced={self.count('misplaced')} "
                f"order_violations={self.count('order_violations')} holes={self.count('holes')} "
                f"unknown_stored={self.unknown_stored} resent_copies={self.resent_copies}")


def verify(producers: list[Producer], read: dict[tuple[str, int], QueueRead]) -> Verdict:
    """Every acknowledged message read back once, where it was acknowledged, in its producer's order.
    A message its client sent again after a broken connection (``Producer.resent``: the first send
    may have been stored by a master that died before answering) may be read twice, its copy before
    the acknowledged one: at-least-once, as the client promises; the copy is counted
    (``resent_copies``) and its position is not held to the producer's order."""
    verdict = Verdict()
    acked: dict[MessageId, tuple[str, int, int]] = {}
    resent: set[MessageId] = set()
    for producer in producers:
        acked.update(producer.acked)
        resent |= producer.resent
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
            if message["queue_offset"] != expected_offset and not queue.holes:
                verdict.order_violations.append(f"{where}: expected offset {expected_offset}")
            if message_id in resent and acked[message_id] != (topic, queue_id, message["queue_offset"]):
                verdict.resent_copies += 1  # the first send's copy, stored before its connection broke
                continue
            if message_id in seen:
                verdict.storage_duplicates.append(message_id)
            seen[message_id] = 1
            producer_name, seq = message_id
            if last_seq.get(producer_name, -1) >= seq:
                verdict.order_violations.append(f"{where}: {producer_name} seq {seq} after {last_seq[producer_name]}")
            last_seq[producer_name] = seq
            if message_id in acked and acked[message_id] != (topic, queue_id, message["queue_offset"]):
                verdict.misplaced.append(f"{message_id} acked at {acked[message_id]}, read at {where}")
            if message_id not in acked:
                verdict.unknown_stored += 1
    verdict.lost = sorted(set(acked) - set(seen))
    return verdict


def verify_streaming(client: StoreClient, topics: dict[str, int], ack_logs: Iterable[AckLog], *,
                     retry_s: float = 30.0, examples_max: int = 100) -> Verdict:
    """``verify`` in bounded memory: each queue is read once, page by page, against the AckLogs.

    Every message read is looked up by its (producer, seq) in its producer's AckLog
    and counted there as seen; the acknowledged seqs never seen are the lost ones.
    The verdict counts every failure and keeps ``examples_max`` examples of each kind.
    """
    logs = {log.producer: log for log in ack_logs}
    for log in logs.values():
        log.reset_seen()
    verdict = Verdict()
    for topic, queue_count in topics.items():
        for queue_id in range(queue_count):
            _verify_queue(client, topic, queue_id, logs, verdict, retry_s=retry_s, examples_max=examples_max)
    for name, log in sorted(logs.items()):
        for acked, seq in log.unread():
            if seq < 0:
                verdict.acked += acked
            else:
                verdict.note("lost", (name, seq), examples_max=examples_max)
    return verdict


def _verify_queue(client: StoreClient, topic: str, queue_id: int, logs: dict[str, AckLog], verdict: Verdict, *,
                  retry_s: float, examples_max: int) -> None:
    last_seq: dict[str, int] = {}  # per producer: the only state kept across pages
    expected_offset: int | None = None
    for page in _walk_queue(client, topic, queue_id, retry_s=retry_s):
        if isinstance(page, int):
            verdict.note("holes", f"{topic}/{queue_id}@{page}", examples_max=examples_max)
            expected_offset = page + 1
            continue
        for message in page:
            queue_offset = message["queue_offset"]
            where = f"{topic}/{queue_id}@{queue_offset}"
            verdict.read += 1
            if expected_offset is not None and queue_offset != expected_offset:
                verdict.note("order_violations", f"{where}: expected offset {expected_offset}",
                             examples_max=examples_max)
            expected_offset = queue_offset + 1
            message_id = parse_body(message["body"])
            if message_id is None:
                verdict.note("corrupt", where, examples_max=examples_max)
                continue
            producer, seq = message_id
            log = logs.get(producer)
            if log is not None and log.mark_seen(seq) > 0:
                verdict.note("storage_duplicates", message_id, examples_max=examples_max)
            if last_seq.get(producer, -1) >= seq:
                verdict.note("order_violations", f"{where}: {producer} seq {seq} after {last_seq[producer]}",
                             examples_max=examples_max)
            last_seq[producer] = seq
            acked_at = log.lookup(seq) if log is not None else None
            if acked_at is None:
                verdict.unknown_stored += 1
            elif acked_at != (topic, queue_id, queue_offset):
                verdict.note("misplaced", f"{message_id} acked at {acked_at}, read at {where}",
                             examples_max=examples_max)


class ProducerThread:
    """Runs a Producer in a background thread until stopped; tests wait on its progress."""

    def __init__(self, producer: Producer, *, batches_per_s: float = 0.0) -> None:
        self.producer = producer
        self.batch_interval_s = 1 / batches_per_s if batches_per_s > 0 else 0.0  # 0: as fast as acks come
        self._stop = threading.Event()
        self._progress = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"producer-{producer.name}", daemon=True)
        self.failure: BaseException | None = None

    def start(self) -> ProducerThread:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            next_batch = time.monotonic()
            while not self._stop.is_set():
                self.producer.send_batch()
                with self._progress:
                    self._progress.notify_all()
                if self.batch_interval_s:  # a paced load (soak): wait for the next slot, or the stop
                    next_batch = max(next_batch + self.batch_interval_s, time.monotonic() - 1.0)
                    self._stop.wait(max(0.0, next_batch - time.monotonic()))
        except BaseException as exc:  # reported to the test thread by wait_acked/stop
            self.failure = exc
            with self._progress:
                self._progress.notify_all()

    @property
    def acked(self) -> int:
        return self.producer.acked_count

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
