"""Failover of a broker set elected on etcd: how long it takes, and what ASYNC replication loses.

    python scripts/bench_failover.py                 # 5 kills under SYNC, 5 under ASYNC
    python scripts/bench_failover.py --kills 20
    python scripts/bench_failover.py --modes SYNC --kills 0 --replica-losses 10   # replicas lost instead

An etcd of one member and three engines on this machine (docs/replication.md, "Failover").
A producer (rmqpy, the set's address, batches of 10 one at a time) runs throughout; each
round SIGKILLs the master's supervisor and actors, waits for the next acknowledged send,
starts the old master again (it cuts its log and follows) and waits until both replicas are
in sync. Printed per mode:

* a new master serves: from the kill until another engine's actors run as master's (ms);
* the producer's view: from the kill to the acknowledgement of the first send begun after it
  (ms), its timeout on the dead master included (3 s here);
* the loss window: acknowledged messages missing from the new master's queues, and the time
  between the first of them being acknowledged and the kill (ms). SYNC must lose none.

With ``--replica-losses N`` (SYNC), N rounds each lose one replica of two, SIGKILLed or paused
(SIGSTOP) in turn, under the same producer, and print the longest time without an
acknowledgement around the loss (ms): the master must take the lost replica out of its in-sync
set before the sends wait for it (docs/replication.md, "Leaving the in-sync set").
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rmqpy
from engine.client import ClientError, StoreClient
from engine.config import StoreConfig
from harness.broker_set import BrokerSet, broker_set, wait_in_sync
from harness.replication import offsets
from harness.workload import read_everything

TOPIC, QUEUES, BATCH = "bench", 4, 10


class Load:
    """Sends batches to the set until stopped; keeps each acknowledged message's body and time."""

    def __init__(self, endpoints: str) -> None:
        self.producer = rmqpy.Producer(endpoints, timeout_ms=3_000)
        self.acked: dict[bytes, tuple[float, float]] = {}  # body -> (when its send began, when acked)
        self.acks_by: list[tuple[float, float, str]] = []  # (began, acked, the engine that acked) of each send
        self.lost: set[bytes] = set()  # found lost by an earlier round
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.seq = 0

    def run(self) -> None:
        rng = random.Random(1)
        while not self.stop.is_set():
            bodies = [b"m-%09d" % (self.seq + i) for i in range(BATCH)]
            self.seq += BATCH
            began = time.monotonic()
            try:
                results = self.producer.send_batch(TOPIC, bodies, queue_id=rng.randrange(QUEUES))
            except ClientError:
                continue
            now = time.monotonic()
            self.acks_by.append((began, now, self.producer.endpoint))
            for body, result in zip(bodies, results, strict=True):
                if result.status == "PUT_OK":
                    self.acked[body] = (began, now)

    def first_ack_after(self, moment: float, *, not_by: str) -> float | None:
        """When a send begun after ``moment`` was first acknowledged by another engine than ``not_by``."""
        acks = [acked for began, acked, by in list(self.acks_by) if began > moment and by != not_by]
        return min(acks) if acks else None


def dispatched_past(client: StoreClient, offset: int, *, timeout_s: float = 60.0) -> None:
    """Until every queue owner and the index applied the log up to ``offset``: the producer goes on
    meanwhile, so the engine is never quite caught up, but what was acknowledged before is."""
    deadline = time.monotonic() + timeout_s
    while min(v for k, v in offsets(client).items() if k.endswith("applied_offset")) < offset:
        if time.monotonic() > deadline:
            raise TimeoutError(f"dispatch did not reach {offset}: {offsets(client)}")
        time.sleep(0.01)  # polls the engine's status


def round_of(brokers: BrokerSet, load: Load) -> tuple[float, float, int, float]:
    old = brokers.wait_master()
    wait_in_sync(old, 2)
    time.sleep(1.0)  # a second of load before the kill: the loss window is the replicas' lag then
    killed_at = time.monotonic()
    old.kill()
    new = brokers.wait_master(other_than=old)
    elected_ms = (time.monotonic() - killed_at) * 1000
    while (served_at := load.first_ack_after(killed_at, not_by=old.endpoint)) is None:
        time.sleep(0.005)  # the producer's thread records it
    served_ms = (served_at - killed_at) * 1000
    old.start()
    wait_in_sync(new, 2)  # and so readers see all the new master holds (SYNC: up to what its replicas hold)
    acked_by_then = dict(load.acked)
    with new.client(timeout_ms=30_000) as client:
        dispatched_past(client, offsets(client)["confirmed_offset"])  # every acknowledged one is in its queue
        stored = {m["body"] for read in read_everything(client, {TOPIC: QUEUES}).values() for m in read.messages}
    lost = {body: acked for body, (_began, acked) in acked_by_then.items()
            if body not in stored and body not in load.lost}
    load.lost.update(lost)
    window_ms = max(0.0, (killed_at - min(lost.values())) * 1000) if lost else 0.0
    return elected_ms, served_ms, len(lost), window_ms


def longest_ack_gap(load: Load, moment: float, *, acks_after: int = 20, timeout_s: float = 30.0) -> float:
    """The longest time without an acknowledgement from the last one before ``moment`` to the
    ``acks_after``-th after it (s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        acks = sorted(acked for _began, acked, _by in list(load.acks_by))
        after = [acked for acked in acks if acked >= moment]
        if len(after) >= acks_after or time.monotonic() > deadline:
            break
        time.sleep(0.01)  # the producer's thread records them
    times = [*[acked for acked in acks if acked < moment][-1:], *after[:acks_after]]
    return max((later - earlier for earlier, later in itertools.pairwise(times)), default=float("inf"))


def replica_round(brokers: BrokerSet, load: Load, *, pause: bool) -> float:
    """One replica of two lost (SIGKILLed, or paused until the sends flow again), then back in sync."""
    master = brokers.wait_master()
    wait_in_sync(master, 2)
    time.sleep(1.0)  # a second of load before the loss
    replica = next(engine for engine in brokers.engines if engine is not master)
    lost_at = time.monotonic()
    if pause:
        with brokers.paused(replica):
            gap = longest_ack_gap(load, lost_at)
    else:
        replica.kill()
        gap = longest_ack_gap(load, lost_at)
        replica.start()
    wait_in_sync(master, 2)
    return gap * 1000


def bench_replica_losses(losses: int) -> None:
    config = StoreConfig.test_min().replace(replication_mode="SYNC", replication_report_interval_ms=200)
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp, \
            broker_set(Path(tmp), config, engines=3) as brokers:
        with brokers.wait_master().client() as client:
            client.create_topic(TOPIC, queue_count=QUEUES)
        load = Load(brokers.endpoints)
        load.thread.start()
        try:
            gaps = {pause: [replica_round(brokers, load, pause=pause) for _ in range(losses) if _ % 2 == pause]
                    for pause in (False, True)}
        finally:
            load.stop.set()
            load.thread.join(30)
            load.producer.close()
    for pause, label in ((False, "killed"), (True, "paused")):
        values = gaps[pause]
        if values:
            print(f"SYNC: one replica of two {label}: the longest time without an acknowledgement: median "
                  f"{statistics.median(values):.0f} ms, max {max(values):.0f} ({len(values)} rounds)", flush=True)


def bench(mode: str, kills: int) -> None:
    config = StoreConfig.test_min().replace(replication_mode=mode, replica_lag_max_ms=2_000,
                                            replication_report_interval_ms=200, replication_config_interval_ms=200)
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp, \
            broker_set(Path(tmp), config, engines=3) as brokers:
        with brokers.wait_master().client() as client:
            client.create_topic(TOPIC, queue_count=QUEUES)
        load = Load(brokers.endpoints)
        load.thread.start()
        try:
            rounds = [round_of(brokers, load) for _ in range(kills)]
        finally:
            load.stop.set()
            load.thread.join(30)
            load.producer.close()
    for label, k in (("a new master serves (route says master)", 0), ("the producer's first ack after the kill", 1)):
        values = [r[k] for r in rounds]
        print(f"{mode}: {label}: median {statistics.median(values):.0f} ms, min {min(values):.0f}, "
              f"max {max(values):.0f} ({kills} kills)")
    print(f"{mode}: acknowledged messages lost per kill: {[r[2] for r in rounds]}; "
          f"window before the kill (ms): {[round(r[3]) for r in rounds]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--modes", default="SYNC,ASYNC")
    parser.add_argument("--replica-losses", type=int, default=0, help="rounds that lose a replica (SYNC)")
    args = parser.parse_args()
    if args.kills:
        for mode in args.modes.split(","):
            bench(mode, args.kills)
    if args.replica_losses:
        bench_replica_losses(args.replica_losses)


if __name__ == "__main__":
    main()
