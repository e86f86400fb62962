"""Delayed and transactional traffic for the chaos run: ``TimerSender`` sends messages due a
moment later, and half messages it commits or rolls back, to ``TIMER_TOPIC`` all along,
whatever is being killed. ``timer_verdict`` then checks that every delayed message it got an
answer for arrived exactly once and not before its time, every half whose commit was
answered arrived exactly once, and none whose rollback was answered arrived at all."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from engine.client import ClientError, EngineError, StoreClient
from harness.workload import read_everything
from supervisor.launcher import EngineProcess

TIMER_TOPIC, TIMER_QUEUES = "chaos-timer", 2
PRODUCER_GROUP = "chaos-tx"


class TimerSender(threading.Thread):
    def __init__(self, engine: EngineProcess, name: str, rng: random.Random) -> None:
        super().__init__(name=f"timer-{name}", daemon=True)
        self.engine = engine
        self.prefix = name
        self.rng = rng
        self.due: dict[str, int] = {}  # uniq key -> deliver time, for each answered delayed send
        self.committed: set[str] = set()
        self.rolled_back: set[str] = set()
        self.failures = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        client = self.engine.client(timeout_ms=3_000)
        n = 0
        try:
            while not self.stop_event.is_set():
                n += 1
                try:
                    if n % 3:
                        self.send_delayed(client, n)
                    else:
                        self.send_half(client, n)
                except ClientError:  # a kill under way: the outcome is unknown, the next send goes on
                    self.failures += 1
                    self.stop_event.wait(0.05)
        finally:
            client.close()

    def send_delayed(self, client: StoreClient, n: int) -> None:
        due = time.time_ns() // 1_000_000 + self.rng.randrange(100, 1_500)
        [result] = client.send(TIMER_TOPIC, [{"body": f"{self.prefix}-d{n}".encode()}], deliver_at_ms=due)
        uniq = client.get_by_id(result["msg_id"])["uniq_key"]
        self.due[uniq] = due

    def send_half(self, client: StoreClient, n: int) -> None:
        [result] = client.send(TIMER_TOPIC, [{"body": f"{self.prefix}-t{n}".encode()}], transaction=True,
                               producer_group=PRODUCER_GROUP)
        uniq = client.get_by_id(result["msg_id"])["uniq_key"]
        decision = "commit" if n % 2 else "rollback"
        try:
            client.end_transaction(result["msg_id"], decision)
        except EngineError as refused:
            if refused.name != "TRANSACTION_ENDED":
                raise
            return  # a retry after a kill found it decided: which way is not known here
        (self.committed if decision == "commit" else self.rolled_back).add(uniq)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(60)


@dataclass
class TimerVerdict:
    delayed: int = 0
    committed: int = 0
    missing: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    early: list[str] = field(default_factory=list)
    rolled_back_seen: list[str] = field(default_factory=list)

    def ok(self) -> bool:
        return self.delayed > 0 and not (self.missing or self.duplicated or self.early or self.rolled_back_seen)

    def summary(self) -> str:
        return (f"timer: {self.delayed} delayed, {self.committed} committed; missing {len(self.missing)}, "
                f"duplicated {len(self.duplicated)}, early {len(self.early)}, rolled back but seen "
                f"{len(self.rolled_back_seen)}")


def timer_verdict(client: StoreClient, senders: list[TimerSender], *, timeout_s: float = 60) -> TimerVerdict:
    """Read the topic until every answered message is there (or the time is up), then judge."""
    due: dict[str, int] = {}
    committed: set[str] = set()
    rolled_back: set[str] = set()
    for sender in senders:
        due.update(sender.due)
        committed |= sender.committed
        rolled_back |= sender.rolled_back
    expected = set(due) | committed
    deadline = time.monotonic() + timeout_s
    offsets = [0] * TIMER_QUEUES
    messages: list[dict] = []
    seen: Counter[str] = Counter()
    while not expected <= set(seen) and time.monotonic() < deadline:
        for queue_id in range(TIMER_QUEUES):  # long polls: they return as soon as a message arrives
            reply = client.pull(TIMER_TOPIC, queue_id, offsets[queue_id], max_messages=1_024, max_wait_ms=200)
            offsets[queue_id] = max(offsets[queue_id], reply["next_offset"])
            messages.extend(reply["messages"])
            seen.update(m["uniq_key"] for m in reply["messages"])
    for queue in read_everything(client, {TIMER_TOPIC: TIMER_QUEUES}).values():  # anything late, or twice
        later = [m for m in queue.messages if m["queue_offset"] >= offsets[m["queue_id"]]]
        messages.extend(later)
        seen.update(m["uniq_key"] for m in later)
    return TimerVerdict(
        delayed=len(due), committed=len(committed), missing=sorted(expected - set(seen)),
        duplicated=sorted(key for key, count in seen.items() if count > 1),
        early=sorted(m["uniq_key"] for m in messages if m["store_timestamp"] < due.get(m["uniq_key"], 0)),
        rolled_back_seen=sorted(rolled_back & set(seen)))
