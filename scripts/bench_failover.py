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
  (ms);
* the loss window: acknowledged messages missing from the new master's queues, and the time
  between the first of them being acknowledged and the kill (ms). SYNC must lose none.

With ``--replica-losses N`` (SYNC), N rounds each lose one replica of two, SIGKILLed or paused
(SIGSTOP) in turn, under the same producer, and print the longest time without an
acknowledgement around the loss (ms): the master must take the lost replica out of its in-sync
set before the sends wait for it (docs/replication.md, "Leaving the in-sync set").

With ``--pauses N`` (SYNC), N rounds each pause the master (SIGSTOP) past its lease until another
engine serves, then resume it: from the election to the producer's first acknowledgement by the
new master (ms), and whether the old master acknowledged anything after that first one.
With ``--etcd-losses N`` (SYNC, three etcd members), N rounds each SIGKILL one etcd member (each
in turn) and start it again: the longest time without an acknowledgement around the loss (ms).
With ``--cluster-kills N`` (ASYNC: two sets have no replica), a cluster of three broker sets (one
of three engines, two of one) under one ``ClusterProducer`` without sharding keys: N rounds each
SIGKILL the first set's master; the other sets' acknowledgements per second from the kill until
the set serves again (a send begun after the kill acknowledged there), beside the 2 s before the kill.

The producers' deadline is ``--timeout-ms`` (10 s): a client stuck on a dead master would show it.
"""

from __future__ import annotations

import argparse
import contextlib
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
from harness.broker_set import BrokerSet, broker_set, cluster_of_sets, wait_in_sync, wait_route_known
from harness.replication import offsets
from harness.workload import read_everything

TOPIC, QUEUES, BATCH = "bench", 4, 10


class Load:
    """Sends batches to the set until stopped; keeps each acknowledged message's body and time."""

    def __init__(self, endpoints: str, timeout_ms: int) -> None:
        self.producer = rmqpy.Producer(endpoints, timeout_ms=timeout_ms)
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


def bench_replica_losses(losses: int, timeout_ms: int) -> None:
    config = StoreConfig.test_min().replace(replication_mode="SYNC", replication_report_interval_ms=200)
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp, \
            broker_set(Path(tmp), config, engines=3) as brokers:
        with brokers.wait_master().client() as client:
            client.create_topic(TOPIC, queue_count=QUEUES)
        load = Load(brokers.endpoints, timeout_ms)
        load.thread.start()
        gaps: dict[bool, list[float]] = {False: [], True: []}
        try:
            for round_index in range(losses):  # killed, paused, killed, ...
                pause = round_index % 2 == 1
                gaps[pause].append(replica_round(brokers, load, pause=pause))
        finally:
            load.stop.set()
            load.thread.join(30)
            load.producer.close()
    for pause, label in ((False, "killed"), (True, "paused")):
        values = gaps[pause]
        if values:
            print(f"SYNC: one replica of two {label}: the longest time without an acknowledgement: median "
                  f"{statistics.median(values):.0f} ms, max {max(values):.0f} ({len(values)} rounds)", flush=True)


def bench(mode: str, kills: int, timeout_ms: int, keep: Path | None = None) -> None:
    config = StoreConfig.test_min().replace(replication_mode=mode, replica_lag_max_ms=2_000,
                                            replication_report_interval_ms=200, replication_config_interval_ms=200)
    with contextlib.ExitStack() as stack:
        root = keep / mode if keep else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-failover-")))
        brokers = stack.enter_context(broker_set(root, config, engines=3))
        with brokers.wait_master().client() as client:
            client.create_topic(TOPIC, queue_count=QUEUES)
        load = Load(brokers.endpoints, timeout_ms)
        load.thread.start()
        rounds = []
        try:
            for _ in range(kills):
                rounds.append(round_of(brokers, load))
                if keep and rounds[-1][2]:
                    print(f"{mode}: a kill lost acknowledged messages: the engines' directories are kept in {root}; "
                          f"the first lost: {sorted(load.lost)[:3]}", flush=True)
                    break
        finally:
            load.stop.set()
            load.thread.join(30)
            load.producer.close()
    for label, k in (("a new master serves (route says master)", 0), ("the producer's first ack after the kill", 1)):
        values = [r[k] for r in rounds]
        print(f"{mode}: {label}: median {statistics.median(values):.0f} ms, min {min(values):.0f}, "
              f"max {max(values):.0f} ({len(rounds)} kills)")
    print(f"{mode}: acknowledged messages lost per kill: {[r[2] for r in rounds]}; "
          f"window before the kill (ms): {[round(r[3]) for r in rounds]}", flush=True)


def pause_round(brokers: BrokerSet, load: Load, lease_ms: int) -> tuple[float, bool]:
    """The master paused until another engine serves; (ms from that election to the producer's first
    acknowledgement by another engine, whether the old master acknowledged a send after that one)."""
    old = brokers.wait_master()
    wait_in_sync(old, 2)
    time.sleep(1.0)  # a second of load before the pause
    paused_at = time.monotonic()
    with brokers.paused(old):
        new = brokers.wait_master(other_than=old, timeout_s=lease_ms / 1000 + 30)
        elected_at = time.monotonic()
        while (served_at := load.first_ack_after(paused_at, not_by=old.endpoint)) is None:
            time.sleep(0.005)  # the producer's thread records it
    wait_in_sync(new, 2)
    late = any(by == old.endpoint and acked > served_at for _began, acked, by in list(load.acks_by))
    return max(0.0, served_at - elected_at) * 1000, late


def bench_pauses(pauses: int, timeout_ms: int) -> None:
    config = StoreConfig.test_min().replace(replication_mode="SYNC", replica_lag_max_ms=2_000,
                                            replication_report_interval_ms=200, replication_config_interval_ms=200)
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp, \
            broker_set(Path(tmp), config, engines=3) as brokers:
        with brokers.wait_master().client() as client:
            client.create_topic(TOPIC, queue_count=QUEUES)
        load = Load(brokers.endpoints, timeout_ms)
        load.thread.start()
        try:
            rounds = [pause_round(brokers, load, config.master_lease_ms) for _ in range(pauses)]
        finally:
            load.stop.set()
            load.thread.join(30)
            load.producer.close()
    values = [r[0] for r in rounds]
    print(f"SYNC: master paused past its lease: the producer's first ack at the new master after its election: "
          f"median {statistics.median(values):.0f} ms, max {max(values):.0f} ({pauses} pauses); the old master "
          f"acknowledged after it in {sum(r[1] for r in rounds)} of {pauses}", flush=True)


def bench_etcd_losses(losses: int, timeout_ms: int) -> None:
    config = StoreConfig.test_min().replace(replication_mode="SYNC", replication_report_interval_ms=200)
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp, \
            broker_set(Path(tmp), config, engines=3, etcd_members=3) as brokers:
        master = brokers.wait_master()
        with master.client() as client:
            client.create_topic(TOPIC, queue_count=QUEUES)
        wait_in_sync(master, 2)
        load = Load(brokers.endpoints, timeout_ms)
        load.thread.start()
        gaps = []
        try:
            for k in range(losses):
                time.sleep(1.0)  # a second of load before the loss
                lost_at = time.monotonic()
                member = brokers.etcd.members[k % len(brokers.etcd.members)]
                brokers.etcd.kill_member(k % len(brokers.etcd.members))
                gaps.append(longest_ack_gap(load, lost_at, acks_after=200) * 1000)
                brokers.etcd.start_member(member)
                brokers.etcd.wait_ready(30)
            masters = {load.producer.endpoint}
        finally:
            load.stop.set()
            load.thread.join(30)
            load.producer.close()
    print(f"SYNC: one etcd member of three killed: the longest time without an acknowledgement: median "
          f"{statistics.median(gaps):.0f} ms, max {max(gaps):.0f} ({losses} losses; master kept: "
          f"{masters == {master.endpoint}})", flush=True)


def bench_cluster_kills(kills: int, timeout_ms: int) -> None:
    config = StoreConfig.test_min().replace(replication_mode="ASYNC", replica_lag_max_ms=2_000,  # sets of one
                                            replication_report_interval_ms=200, replication_config_interval_ms=200,
                                            auto_create_topic=False)
    ratios = []
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp, \
            cluster_of_sets(Path(tmp), config, sets=3, engines=[3, 1, 1]) as sets:
        for broker_set_ in sets:
            broker_set_.wait_master()
        failing = sets[0]
        with rmqpy.Cluster(failing.etcd.endpoints) as cluster:
            cluster.create_topic(TOPIC, queue_count=3 * QUEUES)
            for broker_set_ in sets:
                wait_route_known(broker_set_.engines[0], TOPIC, 3)
            acks: list[tuple[float, float, str]] = []  # (began, acknowledged, broker set) of each send
            stop = threading.Event()
            with rmqpy.ClusterProducer(cluster, timeout_ms=timeout_ms) as producer:
                def run() -> None:
                    while not stop.is_set():
                        began = time.monotonic()
                        try:
                            result = producer.send(TOPIC, b"x")
                        except ClientError:
                            continue
                        acks.append((began, time.monotonic(), result.broker_name))

                thread = threading.Thread(target=run, daemon=True)
                thread.start()
                try:
                    for _ in range(kills):
                        old = failing.wait_master()
                        name = old.config.broker_name
                        wait_in_sync(old, 2)
                        time.sleep(2.0)  # two seconds of load before the kill
                        killed_at = time.monotonic()
                        old.kill()
                        dead_at = time.monotonic()  # a send begun before may have been acknowledged by it
                        failing.wait_master(other_than=old)
                        while (served_at := next((at for began, at, by in list(acks)
                                                  if began > dead_at and by == name), None)) is None:
                            time.sleep(0.005)  # until the set serves the producer again
                        others = [at for _began, at, by in list(acks) if by != name]
                        before = sum(killed_at - 2.0 <= at < killed_at for at in others) / 2.0
                        during = sum(killed_at <= at < served_at for at in others) / (served_at - killed_at)
                        ratios.append((before, during, served_at - killed_at))
                        old.start()
                finally:
                    stop.set()
                    thread.join(timeout_ms / 1000 + 5)
    shares = [during / before for before, during, _ in ratios if before]
    print(f"ASYNC: a cluster of three sets, one set's master killed: the other sets' acknowledgements per second "
          f"while it failed over, of before: median {statistics.median(shares):.0%}, min {min(shares):.0%} "
          f"({kills} kills; the set served again after median "
          f"{statistics.median(r[2] for r in ratios) * 1000:.0f} ms)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--modes", default="SYNC,ASYNC")
    parser.add_argument("--replica-losses", type=int, default=0, help="rounds that lose a replica (SYNC)")
    parser.add_argument("--pauses", type=int, default=0, help="rounds that pause the master (SYNC)")
    parser.add_argument("--etcd-losses", type=int, default=0, help="rounds that kill an etcd member of three")
    parser.add_argument("--cluster-kills", type=int, default=0, help="kills of one set's master in a cluster of 3")
    parser.add_argument("--keep", type=Path, help="keep the engines' directories here, and stop at a kill that loses")
    parser.add_argument("--timeout-ms", type=int, default=10_000, help="the producers' deadline")
    args = parser.parse_args()
    if args.kills:
        for mode in args.modes.split(","):
            bench(mode, args.kills, args.timeout_ms, args.keep)
    if args.replica_losses:
        bench_replica_losses(args.replica_losses, args.timeout_ms)
    if args.pauses:
        bench_pauses(args.pauses, args.timeout_ms)
    if args.etcd_losses:
        bench_etcd_losses(args.etcd_losses, args.timeout_ms)
    if args.cluster_kills:
        bench_cluster_kills(args.cluster_kills, args.timeout_ms)


if __name__ == "__main__":
    main()
