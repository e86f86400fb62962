"""One seeded run on the test bed: a broker set under the nemesis, its clients' history checked.

    hosts   e0 e1 e2   the engines of broker-a (SYNC or ASYNC replication; e0 is elected first)
            m0 m1 m2   the etcd members
            c0         the clients: producers on the set's address, a reader of the master, a
                       consumer group's members on the master

Producers send batches of unique values (``<client>-<seq>``) to the queues in turn and note
each message's outcome; the reader pulls every queue from the engine that is master and notes
what it read; two members of a consumer group share the queues on the master and note what each
poll delivered and which queues each reads after it. The nemesis draws ``faults`` faults from
the seed (``nemesis.py``): before each, a drawn pause of traffic; after each heal, the set must
serve again (a master with its replicas in sync) within ``RECOVERY_S``. At the end every fault
is healed, the clients stop, the master is read whole and each replica's log compared with it
below the confirmed offset, etcd's epoch history read, and ``checker.check`` gives the verdict.
Every loop is bounded in time and count.

``planted``: each engine runs with a bug put in from outside (``PLANTS``), for a run that must
be caught: ``lease`` makes a master's lease deadline an hour later than etcd's, so it keeps
acknowledging past its lease.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import rmqpy
from engine.client import ClientError, EngineError, StoreClient
from engine.config import StoreConfig
from engine.coordination.broker_set import BrokerSetKeys
from engine.coordination.broker_set import history as epoch_history
from engine.coordination.etcd import Etcd
from harness.broker_set import BrokerSet, replicas_differing
from harness.election_chaos import election_config
from harness.replication import offsets
from harness.testbed.bed import TestBed
from harness.testbed.checker import Verdict, check
from harness.testbed.clock import SLEEP_IN_SELECT
from harness.testbed.cluster import broker_set_on
from harness.testbed.history import History, Op, Outcome, Stored
from harness.testbed.nemesis import FAULTS, NEEDS_CLOCKS, NEEDS_RELAY, Nemesis, Placement
from harness.workload import wait_dispatched
from supervisor.launcher import EngineProcess

TOPIC = "jepsen"
QUEUES = 4
BATCH = 4
PRODUCERS = 2
SEND_TIMEOUT_MS = 5_000
RECOVERY_S = 60.0
TRAFFIC_S = (0.5, 1.5)  # traffic before each fault
SENDS_MAX = 200_000  # a producer's bound, whatever the time
SEND_INTERVAL_S = 0.01  # a producer sends a batch this often at most: a long campaign's stores stay small
PULL_MAX = 64
GROUP = "jepsen-group"
GROUP_MEMBERS = 2
GROUP_POLL_MS = 100  # a poll's wait: a member notes the queues it reads at least this often
MASTER_LOOK_S = 0.5  # how often a member asks which engine is master (and opens again there if it moved)
OBSERVE_S = 0.1
PLACEMENT = Placement(engines=["e0", "e1", "e2"], etcd=["m0", "m1", "m2"], clients=["c0"])

# A bug put into every process of an engine by a sitecustomize module on its PYTHONPATH.
PLANTS = {
    "lease": """
import engine.store.shared_offsets as slots
_set = slots.SharedOffsets.set
def _set_later(self, slot, value):
    _set(self, slot, value + 3_600_000 if slot == slots.LEASE_DEADLINE and value > 0 else value)
slots.SharedOffsets.set = _set_later
""",
}


def run_config(mode: Literal["SYNC", "ASYNC"]) -> StoreConfig:
    """The election chaos run's settings, in ``mode``; a group member's session of 3 s (6 s by
    default), so that a seed sees queues change hands."""
    return election_config().replace(replication_mode=mode, consumer_session_timeout_ms=3_000)


@dataclass
class Report:
    seed: int
    mode: str
    schedule: list[str] = field(default_factory=list)
    verdict: Verdict | None = None
    stuck: list[str] = field(default_factory=list)  # faults after whose heal the set did not serve again
    history_path: Path | None = None

    @property
    def ok(self) -> bool:
        return self.verdict is not None and self.verdict.ok() and not self.stuck

    def summary(self) -> str:
        verdict = self.verdict.summary() if self.verdict else "not checked"
        stuck = f" stuck after {self.stuck}" if self.stuck else ""
        return f"seed {self.seed} [{', '.join(self.schedule)}]: {verdict}{stuck}"


class Client:
    """One producer on the set's address, in a thread, noting every message's outcome."""

    def __init__(self, name: str, brokers: BrokerSet, history: History, stop: threading.Event) -> None:
        self.name = name
        self.history = history
        self.stop = stop
        self.producer = rmqpy.Producer(brokers.endpoints, timeout_ms=SEND_TIMEOUT_MS, context=brokers.context)
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)

    def run(self) -> None:
        for seq in range(0, SENDS_MAX, BATCH):
            if self.stop.wait(SEND_INTERVAL_S):
                break
            queue_id = (seq // BATCH) % QUEUES
            values = [f"{self.name}-{seq + k}" for k in range(BATCH)]
            resends = self.producer.resends
            began = time.monotonic()
            try:
                results = self.producer.send_batch(TOPIC, [v.encode() for v in values], queue_id=queue_id)
            except Exception as exc:  # every failure of a send is indeterminate: an attempt may have stored it
                ended = time.monotonic()
                for value in values:
                    self.history.add(Op(process=self.name, f="send", outcome="info", began_s=began, ended_s=ended,
                                        value=value, error=f"{type(exc).__name__}: {exc}"[:200]))
                continue
            ended = time.monotonic()
            resent = self.producer.resends > resends
            for value, result in zip(values, results, strict=True):
                stored = Stored(TOPIC, result.queue_id, result.queue_offset, result.commit_log_offset,
                                store_host(result.msg_id), result.epoch)
                # PUT_OK only: FLUSH_SLAVE_TIMEOUT is stored by the master, not known to be on a replica
                outcome: Outcome = "ok" if result.status == "PUT_OK" else "info"
                self.history.add(Op(process=self.name, f="send", outcome=outcome, began_s=began, ended_s=ended,
                                    value=value, stored=stored, resent=resent,
                                    error="" if outcome == "ok" else result.status))
        self.producer.close()


def store_host(msg_id: str) -> str:
    """The IPv4 store host of an offset message id (its first four bytes)."""
    return ".".join(str(int(msg_id[k:k + 2], 16)) for k in range(0, 8, 2))


class Observer:
    """Asks every engine its route, every ``OBSERVE_S``, and notes those that answer as master."""

    def __init__(self, brokers: BrokerSet, history: History, stop: threading.Event) -> None:
        self.brokers = brokers
        self.history = history
        self.stop = stop
        self.thread = threading.Thread(target=self.run, name="observer", daemon=True)

    def run(self) -> None:
        hosts = {engine.endpoint: store_host_of(engine.endpoint) for engine in self.brokers.engines}
        while not self.stop.wait(OBSERVE_S):
            for engine in self.brokers.engines:
                began = time.monotonic()
                try:
                    with StoreClient(engine.endpoint, timeout_ms=500, context=self.brokers.context) as client:
                        route = client.route()
                except (ClientError, EngineError):
                    continue  # down, paused or cut off: nothing seen
                if route.get("role") == "master":
                    self.history.add(Op(process="observer", f="master", outcome="ok", began_s=began,
                                        ended_s=time.monotonic(), value=hosts[engine.endpoint],
                                        epoch=int(route.get("epoch", 0))))


def store_host_of(endpoint: str) -> str:
    return endpoint.removeprefix("tcp://").rsplit(":", 1)[0]


class Reader:
    """Pulls every queue from the engine that is master now, noting what each pull read."""

    def __init__(self, brokers: BrokerSet, history: History, stop: threading.Event, start: dict[int, int]) -> None:
        self.brokers = brokers
        self.history = history
        self.stop = stop
        self.next = dict(start)
        self.thread = threading.Thread(target=self.run, name="reader", daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            master = self.brokers.master()
            if master is None:
                self.stop.wait(0.1)  # no master now: the next look after a short wait, not a busy loop
                continue
            try:
                with StoreClient(master.endpoint, timeout_ms=1_000, context=self.brokers.context) as client:
                    for queue_id in range(QUEUES):
                        self.pull(client, queue_id)
            except (ClientError, EngineError):
                self.stop.wait(0.1)

    def pull(self, client: StoreClient, queue_id: int) -> None:
        began = time.monotonic()
        reply = client.pull(TOPIC, queue_id, self.next[queue_id], max_messages=PULL_MAX)
        if reply["status"] == "OFFSET_TOO_SMALL":
            self.next[queue_id] = reply["next_offset"]
            return
        if reply["status"] != "FOUND":
            return
        read = [(TOPIC, queue_id, m["queue_offset"], m["body"].decode()) for m in reply["messages"]]
        self.history.add(Op(process="reader", f="read", outcome="ok", began_s=began, ended_s=time.monotonic(),
                            read=read))
        self.next[queue_id] = reply["next_offset"]


class GroupReader:
    """A member of the consumer group ``GROUP`` on the engine that is master, as an application
    runs one: each poll's messages noted as delivered when the poll returned them, then the queues
    it reads; when the master is another engine, or its consumer fails, it closes the consumer
    (without the last commit: a crash's way) and opens one on the master."""

    def __init__(self, name: str, brokers: BrokerSet, history: History, stop: threading.Event) -> None:
        self.name = name
        self.brokers = brokers
        self.history = history
        self.stop = stop
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)

    def run(self) -> None:
        consumer: rmqpy.PullConsumer | None = None
        endpoint = ""
        next_look = 0.0
        try:
            while not self.stop.is_set():
                now = time.monotonic()
                if now >= next_look:
                    next_look = now + MASTER_LOOK_S
                    master = self.brokers.master()
                    if consumer is not None and (master is None or master.endpoint != endpoint):
                        self.close(consumer)
                        consumer = None
                    if consumer is None and master is not None:
                        consumer, endpoint = self.open(master.endpoint), master.endpoint
                if consumer is None:
                    self.stop.wait(0.1)
                    continue
                try:
                    messages = consumer.poll(GROUP_POLL_MS)
                except (ClientError, EngineError):
                    self.close(consumer)
                    consumer = None
                    continue
                ended = time.monotonic()
                if messages:
                    self.history.add(Op(process=self.name, f="consume", outcome="ok", began_s=ended, ended_s=ended,
                                        read=[(TOPIC, m.queue_id, m.queue_offset, m.body.decode()) for m in messages]))
                self.holds(consumer.queue_ids, ended)
        finally:
            if consumer is not None:
                self.close(consumer)

    def open(self, endpoint: str) -> rmqpy.PullConsumer | None:
        try:
            return rmqpy.PullConsumer(GROUP, TOPIC, endpoint=endpoint, context=self.brokers.context,
                                      timeout_ms=2_000, max_wait_ms=GROUP_POLL_MS, commit_every=16,
                                      retry=rmqpy.RetryPolicy(retry_count_max=1))
        except (ClientError, EngineError):
            return None

    def close(self, consumer: rmqpy.PullConsumer) -> None:
        self.holds([], time.monotonic())  # it reads nothing from here on
        with contextlib.suppress(ClientError, EngineError):
            consumer.close(finish=False)  # its last commit may not get through: read again, at least once

    def holds(self, queues: list[int], at_s: float) -> None:
        self.history.add(Op(process=self.name, f="holds", outcome="ok", began_s=at_s, ended_s=at_s,
                            value=",".join(map(str, queues))))


class Campaign:
    """A test bed and a broker set on it, for seeds run one after another (``run``): each seed's
    clients send values of its own (``s<seed>-p<k>-<n>``) and its check reads what was stored
    since it began (the queues from their ends at its start, the logs from theirs)."""

    def __init__(self, root: Path, *, mode: Literal["SYNC", "ASYNC"] = "SYNC", kinds: tuple[str, ...] = FAULTS,
                 planted: str = "", rtt_ms: float = 0.0) -> None:
        """``rtt_ms``: every link's round trip under the faults (``TestBed.base_delay``)."""
        self.root = root
        self.mode = mode
        self.kinds = kinds
        self.rtt_ms = rtt_ms
        self.config = run_config(mode)
        self.bed = TestBed(root, [*PLACEMENT.engines, *PLACEMENT.etcd, *PLACEMENT.clients],
                           relayed=rtt_ms > 0 or any(kind in NEEDS_RELAY for kind in kinds),
                           clocks=any(kind in NEEDS_CLOCKS for kind in kinds))
        self.planted = planted
        self.stack = contextlib.ExitStack()
        self.brokers: BrokerSet | None = None

    def __enter__(self) -> Campaign:
        with contextlib.ExitStack() as stack:
            stack.enter_context(self.bed)
            if self.rtt_ms:
                self.bed.base_delay(self.rtt_ms / 2)
            self.brokers = stack.enter_context(broker_set_on(
                self.bed, self.root, self.config, engines=PLACEMENT.engines, etcd=PLACEMENT.etcd,
                client=PLACEMENT.clients[0],
                environment=_plant(self.root, self.planted, clocks=self.bed.clocks is not None)))
            with self.brokers.serving(RECOVERY_S).client() as client:
                client.create_topic(TOPIC, queue_count=QUEUES)
            self.stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def run(self, seed: int, *, faults: int = 2, on_master: bool = False, hold_s: float | None = None) -> Report:
        """Seed ``seed``'s schedule of ``faults`` faults under traffic, then its check (``on_master``,
        ``hold_s``: as ``Nemesis.draw`` takes them)."""
        brokers = self.brokers
        assert brokers is not None, "a campaign runs seeds inside its with block"
        rng = random.Random(seed)
        report = Report(seed, self.mode)
        history = History()
        floor = self.floor(brokers.serving(RECOVERY_S))
        nemesis = Nemesis(self.bed, brokers, PLACEMENT, history, lease_s=self.config.master_lease_ms / 1000,
                          faults=self.kinds)
        stop = threading.Event()
        clients = [Client(f"s{seed}-p{k}", brokers, history, stop) for k in range(PRODUCERS)]
        reader = Reader(brokers, history, stop, floor.queues)
        members = [GroupReader(f"s{seed}-g{k}", brokers, history, stop) for k in range(GROUP_MEMBERS)]
        threads = [*(c.thread for c in clients), reader.thread, Observer(brokers, history, stop).thread,
                   *(m.thread for m in members)]
        for thread in threads:
            thread.start()
        try:
            for _ in range(faults):
                stop.wait(rng.uniform(*TRAFFIC_S))  # traffic before the fault
                fault = nemesis.draw(rng, on_master=on_master, hold_s=hold_s)
                report.schedule.append(str(fault))
                nemesis.start(fault)
                try:
                    stop.wait(fault.hold_s)  # the fault's hold
                finally:
                    nemesis.heal(fault)
                try:
                    brokers.serving(RECOVERY_S)
                except TimeoutError:
                    report.stuck.append(fault.kind)
                    break
            stop.wait(rng.uniform(*TRAFFIC_S))
        finally:
            stop.set()
            for thread in threads:
                thread.join(SEND_TIMEOUT_MS / 1000 + 30)
        if not report.stuck:
            report.verdict = self.check(history, floor, f"s{seed}-")
        report.history_path = self.root / f"history-{seed}.jsonl"
        history.save(report.history_path)
        with open(self.root / "verdicts.txt", "a") as verdicts:  # beside the histories, for a failed run
            verdicts.write(("ok     " if report.ok else "BROKEN ") + report.summary() + "\n")
        return report

    def floor(self, master: EngineProcess) -> Floor:
        with master.client(timeout_ms=10_000) as client:
            queues = {q: client.queue_stats(TOPIC, q)["max_offset"] for q in range(QUEUES)}
            log = offsets(client)["confirmed_offset"]
        return Floor(queues, log)

    def check(self, history: History, floor: Floor, prefix: str) -> Verdict:
        brokers = self.brokers
        assert brokers is not None
        master = brokers.serving(RECOVERY_S)
        with master.client(timeout_ms=30_000) as client:
            end = wait_dispatched(client, timeout_ms=60_000)["confirmed_offset"]
            read = {(TOPIC, q): _read_queue(client, q, floor.queues[q]) for q in range(QUEUES)}
        keys = BrokerSetKeys(self.config.cluster_name, self.config.broker_name)

        def epochs() -> list[tuple[int, int]]:
            etcd = Etcd(brokers.etcd.endpoints.split(","), timeout_ms=2_000)
            return epoch_history(etcd.get_prefix(keys.epochs))

        final = {key: values for key, (values, _) in read.items()}
        return check(history.snapshot(), final, mode=self.mode, epochs=self.bed.call(PLACEMENT.clients[0], epochs),
                     replicas_differing=replicas_differing(brokers, master, floor.log, end, self.config,
                                                             timeout_s=RECOVERY_S),
                     prefix=prefix, stamps={key: stamps for key, (_, stamps) in read.items()})


@dataclass(frozen=True)
class Floor:
    """Where a seed began: each queue's end, and the log's confirmed offset."""
    queues: dict[int, int]
    log: int


def run_seed(root: Path, seed: int, *, faults: int = 2, mode: Literal["SYNC", "ASYNC"] = "SYNC",
             kinds: tuple[str, ...] = FAULTS, planted: str = "") -> Report:
    """One seed on a test bed and a broker set of its own."""
    with Campaign(root, mode=mode, kinds=kinds, planted=planted) as campaign:
        return campaign.run(seed, faults=faults)


def _read_queue(client: StoreClient, queue_id: int, offset: int) -> tuple[dict[int, str], dict[int, int]]:
    """Queue offset -> value, and -> store timestamp, from ``offset`` to the queue's end."""
    found: dict[int, str] = {}
    stamps: dict[int, int] = {}
    for _ in range(1 << 30):
        reply = client.pull(TOPIC, queue_id, offset, max_messages=256)
        if reply["status"] != "FOUND":
            break
        found.update((m["queue_offset"], m["body"].decode()) for m in reply["messages"])
        stamps.update((m["queue_offset"], m["store_timestamp"]) for m in reply["messages"])
        offset = reply["next_offset"]
    return found, stamps


def _plant(root: Path, planted: str, *, clocks: bool) -> dict[str, str]:
    """The environment that puts ``PLANTS[planted]`` into every process of an engine (its
    sitecustomize takes the place of the clocks' one: it does that one's work too)."""
    if not planted:
        return {}
    folder = root / f"plant-{planted}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(PLANTS[planted] + (SLEEP_IN_SELECT if clocks else ""))
    return {"PYTHONPATH": str(folder)}
