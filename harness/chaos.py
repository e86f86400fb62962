"""A seeded, bounded chaos run: produce and consume while random actors are killed.

``run_chaos`` starts an engine, runs a producer and a consumer thread, and for
each cycle waits for a seeded number of acknowledgements, SIGKILLs a seeded
random actor (or the supervisor itself: once per phase at a seeded cycle,
and one time in ten otherwise; the engine is then started again), and waits for the supervisor's ``recovery.done``.
The first half of the cycles run under ASYNC_FLUSH, the second under
SYNC_FLUSH (a clean stop and start in between). Pop workers of one group
(``harness/pop_workload.py``) pop and ack ``POP_TOPIC`` all along. At the end
every queue is read back and checked (``workload.verify``); the pop group must
ack every stored message of ``POP_TOPIC`` (its own counts agreeing), and none
acked under SYNC_FLUSH may be delivered again. The gRPC endpoint is on, so it is killed
too, and the official RocketMQ 5 producer sends through it all along
(``harness/grpc_workload.py``): every message it got a receipt for must be stored. Delayed
and transactional messages go to ``TIMER_TOPIC`` all along (``harness/timer_workload.py``):
each answered one must arrive exactly once, not early, and no rolled-back one at all. The
engine is stopped, and ``check_store`` must find nothing. A replica follows the engine all along
(``replica_of``, docs/replication.md), and its actors are killed too: at the end its log must
be the engine's byte for byte, its queues must read the same, and ``check_store`` must pass on
it. The seed replays the same schedule.
"""

from __future__ import annotations

import random
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from engine.client import ClientError
from engine.config import StoreConfig
from engine.ipc.control import EventStream
from engine.offline.check import Finding, check_store
from harness.faults import actor_pids, kill_actor
from harness.grpc_workload import GRPC_QUEUES, GRPC_TOPIC, GrpcSender, missing_receipts
from harness.pop_workload import PopLedger, PopVerdict, PopWorker, drain, message_key
from harness.replication import log_bytes, wait_replicated
from harness.timer_workload import TIMER_QUEUES, TIMER_TOPIC, TimerSender, TimerVerdict, timer_verdict
from harness.workload import Producer, ProducerThread, Verdict, read_everything, verify, wait_dispatched
from supervisor.launcher import EngineProcess, free_port

TOPICS = {"chaos-a": 4, "chaos-b": 3}
POP_TOPIC, POP_GROUP = "chaos-a", "chaos-pop"
SUPERVISOR_KILL_RATIO = 0.1


@dataclass
class ChaosReport:
    seed: int
    schedule: list[str] = field(default_factory=list)
    verdict: Verdict | None = None
    findings: list[Finding] = field(default_factory=list)
    consumed: int = 0
    pop_verdict: PopVerdict | None = None
    pop_drained: bool = False
    grpc_receipts: int = 0
    grpc_missing: list[str] = field(default_factory=list)
    timer_verdict: TimerVerdict | None = None
    monitor_ok: bool = False  # after the faults, a scrape of the metrics shows every actor up
    replica_same: bool = False  # the replica's log and queues are the master's
    replica_findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        pops_ok = self.pop_verdict is not None and self.pop_verdict.ok() and self.pop_drained
        grpc_ok = self.grpc_receipts > 0 and not self.grpc_missing
        timer_ok = self.timer_verdict is not None and self.timer_verdict.ok()
        return self.verdict is not None and self.verdict.ok() and pops_ok and grpc_ok and timer_ok \
            and self.monitor_ok and not self.findings and self.replica_same and not self.replica_findings

    def summary(self) -> str:
        verdict = self.verdict.summary() if self.verdict else "not verified"
        pops = self.pop_verdict.summary() if self.pop_verdict else "pop: not verified"
        return (f"seed={self.seed} cycles={len(self.schedule)} consumed_live={self.consumed} {verdict} {pops} "
                f"(engine counts all acked: {self.pop_drained}) grpc_receipts={self.grpc_receipts} "
                f"grpc_missing={len(self.grpc_missing)} "
                f"{self.timer_verdict.summary() if self.timer_verdict else 'timer: not verified'} "
                f"monitor_ok={self.monitor_ok} check_findings={len(self.findings)} "
                f"replica_same={self.replica_same} replica_check_findings={len(self.replica_findings)}")


class Consumer(threading.Thread):
    """Tails every queue while faults happen; errors and timeouts are expected and ignored."""

    def __init__(self, engine: EngineProcess) -> None:
        super().__init__(name="consumer", daemon=True)
        self.engine = engine
        self.stop_event = threading.Event()
        self.offsets = {(t, q): 0 for t, n in TOPICS.items() for q in range(n)}
        self.consumed = 0

    def run(self) -> None:
        client = self.engine.client(timeout_ms=2_000)
        try:
            while not self.stop_event.is_set():
                for (topic, queue_id), offset in self.offsets.items():
                    try:
                        reply = client.pull(topic, queue_id, offset, max_messages=64)
                    except ClientError:
                        continue
                    if reply["status"] == "FOUND":
                        self.consumed += len(reply["messages"])
                        self.offsets[(topic, queue_id)] = reply["next_offset"]
        finally:
            client.close()


def replica_config(flush_mode: str, master: StoreConfig) -> StoreConfig:
    return StoreConfig.test_min().replace(flush_mode=flush_mode, segment_size_bytes=1 << 20,
                                          message_body_bytes_max=64 * 1024, send_batch_bytes_max=256 * 1024,
                                          replica_of=master.replication_endpoint, replication_report_interval_ms=200)


def chaos_config(flush_mode: str, replication_endpoint: str) -> StoreConfig:
    return StoreConfig.test_min().replace(flush_mode=flush_mode, segment_size_bytes=1 << 20,
                                          message_body_bytes_max=64 * 1024, send_batch_bytes_max=256 * 1024,
                                          grpc_enabled=True, grpc_endpoint=f"127.0.0.1:{free_port()}",
                                          metrics_endpoint=f"127.0.0.1:{free_port()}",
                                          replication_endpoint=replication_endpoint)


def _every_actor_up_in_metrics(engine: EngineProcess, timeout_s: float = 15) -> bool:
    """A scrape of the monitor (killed like the others) shows every actor of the engine up."""
    expected = set(actor_pids(engine.store_dir)) - {"supervisor"}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{engine.config.metrics_endpoint}/metrics", timeout=5) as response:
                text = response.read().decode()
        except OSError:
            text = ""
        up = {line.split('"')[1] for line in text.splitlines()
              if line.startswith("rmqpy_actor_up{") and line.endswith(" 1.0")}
        if up == expected:
            return True
        time.sleep(0.2)  # the monitor may be restarting; the actors report once a second
    return False


def _kill_supervisor(engine: EngineProcess) -> None:
    actors = [psutil.Process(pid) for pid in engine.actor_pids().values()]
    psutil.Process(engine.pid).kill()
    _gone, orphans = psutil.wait_procs(actors, timeout=15)
    if orphans:
        raise AssertionError(f"actors outlived the supervisor: {[p.pid for p in orphans]}")
    assert engine.process is not None
    engine.process.wait(10)
    engine.process = None
    engine.start()


def _cycle(engine: EngineProcess, replica: EngineProcess, producer: ProducerThread, rng: random.Random,
           report: ChaosReport, *, force_supervisor: bool) -> None:
    producer.wait_acked(producer.acked + rng.randrange(40, 160))
    if force_supervisor or rng.random() < SUPERVISOR_KILL_RATIO:
        report.schedule.append("supervisor")
        _kill_supervisor(engine)
        return
    victims = [(engine, name) for name in actor_pids(engine.store_dir) if name != "supervisor"]
    victims += [(replica, name) for name in actor_pids(replica.store_dir) if name != "supervisor"]
    target, name = rng.choice(sorted(victims, key=lambda victim: (victim[0] is replica, victim[1])))
    events = EventStream(target.store_dir)
    try:
        kill_actor(target.store_dir, name)
        report.schedule.append(f"replica {name}" if target is replica else name)
        events.wait_for("actor.exited", name=name)
        events.wait_for("recovery.done", name=name)
    finally:
        events.close()


def _replica_verdict(engine: EngineProcess, replica: EngineProcess, report: ChaosReport) -> None:
    """The replica's log is the master's byte for byte, and its queues read the same."""
    with engine.client(timeout_ms=10_000) as master_client, replica.client(timeout_ms=10_000) as replica_client:
        end = wait_replicated(master_client, replica_client, timeout_s=60)
        size = engine.config.segment_size_bytes
        same_log = log_bytes(replica.store_dir, 0, end, size) == log_bytes(engine.store_dir, 0, end, size)
        report.replica_same = same_log and read_everything(replica_client, TOPICS) == read_everything(
            master_client, TOPICS)


def run_chaos(store_dir: Path, *, seed: int, cycles: int = 20, log: bool = False) -> ChaosReport:
    rng = random.Random(seed)
    report = ChaosReport(seed)
    client = None
    producers: list[Producer] = []
    ledger = PopLedger()
    workers: list[PopWorker] = []
    grpc_senders: list[GrpcSender] = []
    timer_senders: list[TimerSender] = []
    replication_endpoint = f"tcp://127.0.0.1:{free_port()}"
    engine = EngineProcess(store_dir, config=chaos_config("ASYNC_FLUSH", replication_endpoint))
    replica = EngineProcess(store_dir.parent / f"{store_dir.name}-replica",
                            config=replica_config("ASYNC_FLUSH", engine.config))
    try:
        for phase, flush_mode in enumerate(("ASYNC_FLUSH", "SYNC_FLUSH")):
            engine.config = chaos_config(flush_mode, replication_endpoint).replace(endpoint=engine.endpoint,
                                                                                   store_port=engine.port)
            engine.start()
            if phase == 0:
                replica.start()
            producer = Producer(f"p{phase}", engine.client(timeout_ms=3_000), TOPICS, random.Random(rng.random()),
                                body_sizes=(40, 300, 2000), batch_size=8)
            producers.append(producer)
            thread = ProducerThread(producer).start()
            consumer = Consumer(engine)
            consumer.start()
            with engine.client() as setup:
                setup.create_topic(GRPC_TOPIC, queue_count=GRPC_QUEUES)
                setup.create_topic(TIMER_TOPIC, queue_count=TIMER_QUEUES)
            timer_sender = TimerSender(engine, f"t{phase}", random.Random(rng.random()))
            timer_senders.append(timer_sender)
            timer_sender.start()
            grpc_sender = GrpcSender(engine, f"g{phase}")
            grpc_senders.append(grpc_sender)
            grpc_sender.start()
            if flush_mode == "SYNC_FLUSH":
                ledger.strict_since = time.monotonic()  # from here on no acked message may come back
            workers = [PopWorker(engine, POP_GROUP, POP_TOPIC, ledger, invisible_ms=2_000) for _ in range(2)]
            for worker in workers:
                worker.start()
            phase_cycles = cycles // 2 if phase == 0 else cycles - cycles // 2
            supervisor_cycle = rng.randrange(phase_cycles) if phase_cycles else -1  # at least one per phase
            for cycle in range(phase_cycles):
                _cycle(engine, replica, thread, rng, report, force_supervisor=cycle == supervisor_cycle)
                if log:
                    print(f"cycle {len(report.schedule)}: killed {report.schedule[-1]} "
                          f"(acked so far {thread.acked})", flush=True)
            thread.wait_acked(thread.acked + 50)
            thread.stop()
            grpc_sender.stop()
            timer_sender.stop()
            consumer.stop_event.set()
            consumer.join(30)
            report.consumed += consumer.consumed
            producer.client.close()
            if phase == 0:
                for worker in workers:
                    worker.stop()
                engine.stop()
        client = engine.client(timeout_ms=10_000)
        wait_dispatched(client, timeout_ms=30_000)
        read = read_everything(client, TOPICS)
        report.verdict = verify(producers, read)
        stored = {message_key(m) for (topic, _q), queue in read.items() if topic == POP_TOPIC for m in queue.messages}
        report.pop_drained = drain(engine, workers, ledger, stored, group=POP_GROUP, topic=POP_TOPIC,
                                   queue_count=TOPICS[POP_TOPIC], timeout_s=60)
        report.pop_verdict = ledger.verdict(stored)
        report.grpc_receipts = sum(len(sender.receipts) for sender in grpc_senders)
        report.grpc_missing = missing_receipts(client, grpc_senders)
        report.timer_verdict = timer_verdict(client, timer_senders)
        report.monitor_ok = _every_actor_up_in_metrics(engine)
        _replica_verdict(engine, replica, report)
    finally:
        for timer_sender in timer_senders:
            timer_sender.stop()
        for worker in workers:
            worker.stop()
        for sender in grpc_senders:
            sender.stop()
        if client is not None:
            client.close()
        replica.stop()
        engine.stop()
    report.findings = check_store(store_dir, engine.config)
    report.replica_findings = check_store(replica.store_dir, replica.config)
    return report
