"""A pop-consumer workload for fault tests: workers that pop and ack, and what they must have seen.

``PopWorker`` threads pop from a topic for one group and ack everything they get,
through faults (a refused or unanswered request is retried by the next loop). The
``PopLedger`` keeps, per message (its topic, queue and queue offset), when an ack was confirmed (the engine said OK)
and every delivery. ``PopLedger.verdict`` then says:

* ``unacked``: stored messages the group never got acked: lost for the group (an ack
  whose reply was lost to a fault may have been recorded: those messages are counted
  apart, and the caller checks the engine's own counts, ``pop_stats``);
* ``after_ack``: deliveries asked for after an ack of the same message was confirmed.
  Under SYNC_FLUSH there must be none; under ASYNC_FLUSH a kill may lose the acks of
  the last flush interval, and their messages come back (at least once).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.client import ClientError, StoreClient
from supervisor.launcher import EngineProcess

MessageKey = tuple[str, int, int]  # topic, queue id, queue offset


def message_key(message: dict[str, Any]) -> MessageKey:
    return message["topic"], message["queue_id"], message["queue_offset"]


@dataclass
class PopVerdict:
    acked: int
    ack_unknown: int
    unacked: list[MessageKey]
    after_ack: list[MessageKey]
    deliveries: int

    def ok(self, *, redelivery_after_ack_allowed: bool = False) -> bool:
        return not self.unacked and (redelivery_after_ack_allowed or not self.after_ack)

    def summary(self) -> str:
        return (f"pop: acked={self.acked} ack_unknown={self.ack_unknown} deliveries={self.deliveries} "
                f"unacked={len(self.unacked)} delivered_after_ack={len(self.after_ack)} (first {self.after_ack[:3]!r})")


@dataclass
class PopLedger:
    lock: threading.Lock = field(default_factory=threading.Lock)
    acked_at: dict[MessageKey, float] = field(default_factory=dict)  # first confirmed ack, monotonic s
    ack_unknown: set[MessageKey] = field(default_factory=set)  # acks sent whose reply never came
    after_ack: list[MessageKey] = field(default_factory=list)
    deliveries: int = 0
    strict_since: float = float("inf")  # deliveries asked for after this are checked (SYNC_FLUSH phases)

    def delivered(self, bodies: Iterable[MessageKey], asked_at: float) -> None:
        with self.lock:
            for key in bodies:
                self.deliveries += 1
                confirmed = self.acked_at.get(key)
                if confirmed is not None and confirmed >= self.strict_since and asked_at > confirmed:
                    self.after_ack.append(key)

    def acked(self, bodies: Iterable[MessageKey], at: float) -> None:
        with self.lock:
            for key in bodies:
                self.acked_at.setdefault(key, at)

    def unanswered(self, bodies: Iterable[MessageKey]) -> None:
        with self.lock:
            self.ack_unknown.update(bodies)

    def settled(self, stored: set[MessageKey]) -> bool:
        with self.lock:
            return all(key in self.acked_at or key in self.ack_unknown for key in stored)

    def verdict(self, stored: Iterable[MessageKey]) -> PopVerdict:
        with self.lock:
            unacked = [key for key in stored if key not in self.acked_at and key not in self.ack_unknown]
            unknown = len(self.ack_unknown - self.acked_at.keys())
            return PopVerdict(len(self.acked_at), unknown, unacked, list(self.after_ack), self.deliveries)


class PopWorker(threading.Thread):
    def __init__(self, engine: EngineProcess, group: str, topic: str, ledger: PopLedger, *,
                 invisible_ms: int = 3_000, max_messages: int = 32) -> None:
        super().__init__(name=f"pop-{group}", daemon=True)
        self.engine, self.group, self.topic, self.ledger = engine, group, topic, ledger
        self.invisible_ms = invisible_ms
        self.max_messages = max_messages
        self.stop_event = threading.Event()
        self.idle = threading.Event()  # the last pop found nothing

    def run(self) -> None:
        client = self.engine.client(timeout_ms=2_000)
        try:
            while not self.stop_event.is_set():
                asked_at = time.monotonic()
                try:
                    messages = client.pop(self.group, self.topic, max_messages=self.max_messages,
                                          invisible_ms=self.invisible_ms, max_wait_ms=200)
                except ClientError:
                    continue
                self.ledger.delivered((message_key(m) for m in messages), asked_at)
                if not messages:
                    self.idle.set()
                    continue
                self.idle.clear()
                try:
                    failed = {f["receipt_handle"] for f in client.ack(self.group, messages)}
                except ClientError:  # not known whether the acks were recorded: the messages may come back
                    self.ledger.unanswered(message_key(m) for m in messages)
                    continue
                self.ledger.acked((message_key(m) for m in messages if m["receipt_handle"] not in failed),
                                  time.monotonic())
        finally:
            client.close()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(30)


def drain(engine: EngineProcess, workers: list[PopWorker], ledger: PopLedger, stored: set[MessageKey], *,
          group: str, topic: str, queue_count: int, timeout_s: float = 60) -> bool:
    """Wait until every stored message is acked, in the ledger and by the engine's own counts
    (every queue's ack floor at its end, nothing in flight); False if the time ran out."""
    deadline = time.monotonic() + timeout_s
    with engine.client(timeout_ms=2_000) as client:
        while time.monotonic() < deadline:
            if ledger.settled(stored) and all(_all_done(client, group, topic, q) for q in range(queue_count)):
                return True
            for worker in workers:
                worker.idle.wait(0.2)
    return False


def _all_done(client: StoreClient, group: str, topic: str, queue_id: int) -> bool:
    try:
        stats = client.pop_stats(group, topic, queue_id)
    except ClientError:
        return False
    return stats["in_flight"] == 0 and stats["ack_floor"] == stats["max_offset"]
