"""Failover of a broker set elected on etcd: how long it takes, and what ASYNC replication loses.

    python scripts/bench_failover.py                 # 5 kills under SYNC, 5 under ASYNC
    python scripts/bench_failover.py --kills 20

An etcd of one member and three engines on this machine (docs/replication.md, "Failover").
A producer (rmqpy, the set's address, batches of 10 one at a time) runs throughout; each
round SIGKILLs the master's supervisor and actors, waits for the next acknowledged send,
starts the old master again (it cuts its log and follows) and waits until both replicas are
in sync. Printed per mode:

* serving again: from the kill to the first send acknowledged by the new master (ms);
* the loss window: acknowledged messages missing from the new master's queues, and the time
  between the first of them being acknowledged and the kill (ms). SYNC must lose none.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rmqpy
from engine.client import ClientError
from engine.config import StoreConfig
from harness.broker_set import BrokerSet, broker_set
from harness.replication import offsets
from harness.workload import read_everything
from supervisor.launcher import EngineProcess

TOPIC, QUEUES, BATCH = "bench", 4, 10


class Load:
    """Sends batches to the set until stopped; keeps each acknowledged message's body and time."""

    def __init__(self, endpoints: str) -> None:
        self.producer = rmqpy.Producer(endpoints, timeout_ms=3_000)
        self.acked: dict[bytes, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.seq = 0

    def run(self) -> None:
        rng = random.Random(1)
        while not self.stop.is_set():
            bodies = [b"m-%09d" % (self.seq + i) for i in range(BATCH)]
            self.seq += BATCH
            try:
                results = self.producer.send_batch(TOPIC, bodies, queue_id=rng.randrange(QUEUES))
            except ClientError:
                continue
            now = time.monotonic()
            for body, result in zip(bodies, results, strict=True):
                if result.status == "PUT_OK":
                    self.acked[body] = now

    def acked_after(self, moment: float) -> int:
        return sum(1 for at in list(self.acked.values()) if at > moment)


def wait_in_sync(master: EngineProcess, replicas: int) -> None:
    deadline = time.monotonic() + 120
    with master.client(timeout_ms=2_000) as client:
        while offsets(client).get("in_sync_replicas", 0) < replicas:
            if time.monotonic() > deadline:
                raise TimeoutError("the replicas did not come in sync")
            time.sleep(0.05)


def round_of(brokers: BrokerSet, load: Load) -> tuple[float, int, float]:
    old = brokers.wait_master()
    wait_in_sync(old, 2)
    time.sleep(1.0)  # a second of load before the kill: the loss window is the replicas' lag then
    killed_at = time.monotonic()
    old.kill()
    while load.acked_after(killed_at) == 0:
        time.sleep(0.005)
    served_ms = (min(at for at in list(load.acked.values()) if at > killed_at) - killed_at) * 1000
    new = brokers.wait_master(other_than=old)
    with new.client(timeout_ms=30_000) as client:
        stored = {m["body"] for read in read_everything(client, {TOPIC: QUEUES}).values() for m in read.messages}
    lost = [at for body, at in list(load.acked.items()) if at < killed_at and body not in stored]
    window_ms = (killed_at - min(lost)) * 1000 if lost else 0.0
    old.start()
    wait_in_sync(new, 2)
    return served_ms, len(lost), window_ms


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
    served = [r[0] for r in rounds]
    print(f"{mode}: serving again after a master kill: median {statistics.median(served):.0f} ms, "
          f"min {min(served):.0f}, max {max(served):.0f} ({kills} kills)")
    print(f"{mode}: acknowledged messages lost per kill: {[r[1] for r in rounds]}; "
          f"window before the kill (ms): {[round(r[2]) for r in rounds]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--modes", default="SYNC,ASYNC")
    args = parser.parse_args()
    for mode in args.modes.split(","):
        bench(mode, args.kills)


if __name__ == "__main__":
    main()
