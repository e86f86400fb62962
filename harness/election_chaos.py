"""A seeded chaos run of a broker set elected on etcd: faults of every kind while rmqpy produces.

``run_election_chaos`` starts three etcd members and three engines (SYNC replication) and runs
a producer on the set's address. Each cycle waits for a seeded number of acknowledgements, then
does one seeded fault:

* ``actor``: SIGKILL a random actor of a random engine, the broker membership actor included;
* ``master``: SIGKILL the master's supervisor and actors (a crash), then start it again;
* ``replica``: SIGKILL a replica's supervisor and actors, then start it again (it catches up);
* ``pause``: SIGSTOP the master's processes past its lease (a partition), then SIGCONT;
* ``etcd``: SIGKILL one etcd member, then start it again.

After each it waits until a master serves and every engine is back. A consumer pulls from
whichever engine is master throughout. At the end every acknowledged message must be read back
exactly once, in order (``workload.verify``), nothing the consumer read may have changed, every
engine's log must be the master's byte for byte, and ``check_store`` must pass on each store.
No two engines may ever have claimed one epoch (the epochs in etcd are one per claim).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import StoreConfig
from engine.coordination.broker_set import BrokerSetKeys, history
from engine.coordination.etcd import Etcd
from engine.offline.check import Finding, check_store
from harness.broker_set import BrokerSet, broker_set, replicas_differing
from harness.faults import actor_pids, kill_actor
from harness.workload import Verdict, read_everything, verify, wait_dispatched

TOPICS = {"elected-a": 4, "elected-b": 2}
FAULTS = ("actor", "actor", "master", "replica", "pause", "etcd")
ACTORS = ("membership", "writer", "reput", "front", "replication-sender", "replication-receiver", "owner-0")


@dataclass
class ElectionChaosReport:
    seed: int
    schedule: list[str] = field(default_factory=list)
    verdict: Verdict | None = None
    findings: list[Finding] = field(default_factory=list)
    logs_equal: bool = False
    reads_changed: list[str] = field(default_factory=list)
    epochs: list[tuple[int, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.verdict is not None and self.verdict.ok() and not self.findings and self.logs_equal
                and not self.reads_changed)

    def summary(self) -> str:
        verdict = self.verdict.summary() if self.verdict else "not verified"
        return (f"{verdict} findings={len(self.findings)} logs_equal={self.logs_equal} "
                f"reads_changed={self.reads_changed[:5]} "
                f"epochs={[epoch for epoch, _ in self.epochs]}")


def election_config() -> StoreConfig:
    return StoreConfig.test_min().replace(replication_mode="SYNC", replica_lag_max_ms=2_000,
                                          replication_report_interval_ms=200, replication_config_interval_ms=200,
                                          sync_flush_timeout_ms=2_000)


def _fault(brokers: BrokerSet, rng: random.Random, report: ElectionChaosReport) -> None:
    master = brokers.wait_master()
    kind = rng.choice(FAULTS)
    if kind == "actor":
        engine = rng.choice(brokers.engines)
        running = actor_pids(engine.store_dir)
        name, _pid = kill_actor(engine.store_dir, rng.choice([a for a in ACTORS if a in running]), rng=rng)
        report.schedule.append(f"actor:{engine.store_dir.name}/{name}")
    elif kind == "master":
        master.kill()
        brokers.wait_master(other_than=master)
        master.start()
        report.schedule.append(f"master:{master.store_dir.name}")
    elif kind == "replica":
        replica = rng.choice([engine for engine in brokers.engines if engine is not master])
        replica.kill()
        replica.start()
        report.schedule.append(f"replica:{replica.store_dir.name}")
    elif kind == "pause":
        with brokers.paused(master):
            brokers.wait_master(other_than=master)
        report.schedule.append(f"pause:{master.store_dir.name}")
    else:
        k = rng.randrange(len(brokers.etcd.members))
        brokers.etcd.kill_member(k)
        brokers.etcd.start_member(brokers.etcd.members[k])
        report.schedule.append(f"etcd:{k}")


def run_election_chaos(root: Path, *, seed: int, cycles: int = 8) -> ElectionChaosReport:
    rng = random.Random(seed)
    report = ElectionChaosReport(seed)
    config = election_config()
    with broker_set(root, config, engines=3, etcd_members=3) as brokers:
        with brokers.wait_master().client() as client:
            for topic, queues in TOPICS.items():
                client.create_topic(topic, queue_count=queues)
        brokers.serving()
        with brokers.consuming(TOPICS) as consumer, brokers.producing(TOPICS, seed) as thread:
            for _ in range(cycles):
                thread.wait_acked(thread.acked + rng.randint(50, 300), timeout_s=120)
                _fault(brokers, rng, report)
                brokers.serving()
            thread.wait_acked(thread.acked + 100, timeout_s=120)
        master = brokers.serving()
        with master.client(timeout_ms=30_000) as client:
            # A master's actor restarted by the last fault may still be dispatching: what its queues
            # hold is read once they hold all the log (a read before it finds the tail "lost").
            end = wait_dispatched(client, timeout_ms=60_000)["confirmed_offset"]
            stored = read_everything(client, TOPICS)
        report.verdict = verify([thread.producer], stored)
        report.reads_changed = consumer.changed(stored)
        report.logs_equal = not replicas_differing(brokers, master, 0, end, config)
        etcd = Etcd(brokers.etcd.endpoints.split(","), timeout_ms=2_000)
        report.epochs = history(etcd.get_prefix(BrokerSetKeys(config.cluster_name, config.broker_name).epochs))
    for engine in brokers.engines:
        report.findings += check_store(engine.store_dir, engine.config)
    return report
