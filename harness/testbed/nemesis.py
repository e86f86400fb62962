"""The nemesis of a test-bed run: faults drawn from a seed, each started, held and healed.

    kill-engine       SIGKILL an engine (the master or a replica), started again at the heal
    pause-engine      SIGSTOP an engine past its lease, SIGCONT at the heal
    kill-etcd         SIGKILL an etcd member, started again at the heal
    pause-etcd        SIGSTOP an etcd member, SIGCONT at the heal
    master-etcd       the master cut off from every etcd member only
    master-replicas   the master cut off from its replicas only
    master-clients    the master cut off from the clients only
    master-replica-etcd  the master and one replica cut off from etcd (the other replica is
                      elected; the one cut off keeps following the old master until the heal)
    etcd-minority     one etcd member cut off from every other host
    etcd-majority     two etcd members cut off from every other host (they keep each other: a
                      quorum the engines cannot reach)
    latency-1ms       every link 0.5 ms each way (1 ms round trip), 0.2 ms of jitter
    latency-50ms      every link 25 ms each way (50 ms round trip), 5 ms of jitter
    loss-5            every host drops 5 % of what it receives
    clock-jump        an engine's wall clock a minute or an hour back or ahead (``clock.py``), back
                      at the heal: store timestamps, retention and timers read it, the lease does not

Every fault is noted in the history as it starts and as it heals (``unavailable_s`` measures
from them). A fault's hold is drawn between ``HOLD_S`` bounds; a pause always outlasts the lease.
"""

from __future__ import annotations

import random
import signal
from dataclasses import dataclass

from harness.broker_set import BrokerSet, signal_tree
from harness.testbed.bed import TestBed
from harness.testbed.clock import JUMP_SETTLE_S
from harness.testbed.history import History
from supervisor.launcher import EngineProcess

FAULTS = ("kill-engine", "pause-engine", "kill-etcd", "pause-etcd", "master-etcd", "master-replicas",
          "master-clients", "master-replica-etcd", "etcd-minority", "etcd-majority", "latency-1ms", "latency-50ms",
          "loss-5", "clock-jump")
NEEDS_RELAY = ("latency-1ms", "latency-50ms")
NEEDS_CLOCKS = ("clock-jump",)
CLOCK_JUMPS_S = (-3600, -60, 60, 3600)
HOLD_S = (1.0, 4.0)
LATENCY = {"latency-1ms": (0.5, 0.2), "latency-50ms": (25.0, 5.0)}  # one way, jitter (ms)


@dataclass
class Placement:
    """Which host runs what."""
    engines: list[str]
    etcd: list[str]
    clients: list[str]


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str  # the host it falls on ("" for the whole bed)
    hold_s: float
    offset_s: int = 0  # a clock jump's

    def __str__(self) -> str:
        jump = f" {self.offset_s:+d}s" if self.kind in NEEDS_CLOCKS else ""
        return f"{self.kind}{'@' + self.target if self.target else ''}{jump} {self.hold_s}s"


class Nemesis:
    def __init__(self, bed: TestBed, brokers: BrokerSet, placement: Placement, history: History, *,
                 lease_s: float, faults: tuple[str, ...] = FAULTS) -> None:
        self.bed = bed
        self.brokers = brokers
        self.placement = placement
        self.history = history
        self.lease_s = lease_s
        self.faults = faults

    def host_of(self, engine: EngineProcess) -> str:
        return self.placement.engines[self.brokers.engines.index(engine)]

    def draw(self, rng: random.Random, *, on_master: bool = False, hold_s: float | None = None) -> Fault:
        """The next fault; one on the master falls on the engine that is master now (a kill or a
        pause falls on any engine three times in ten, unless ``on_master``). ``hold_s``: instead of
        one drawn."""
        kind = rng.choice(self.faults)
        hold_s = hold_s if hold_s is not None else round(rng.uniform(*HOLD_S), 2)
        master = self.brokers.master()
        engine_host = self.host_of(master) if master is not None else rng.choice(self.placement.engines)
        if kind in ("kill-engine", "pause-engine", "clock-jump") and not on_master and rng.random() < 0.3:
            engine_host = rng.choice(self.placement.engines)  # a replica, sometimes
        if kind == "pause-engine":
            hold_s = max(hold_s, self.lease_s + 1.0)
        offset_s = 0
        if kind == "clock-jump":
            hold_s = max(hold_s, 2 * JUMP_SETTLE_S)
            offset_s = rng.choice(CLOCK_JUMPS_S)
        target = {"kill-engine": engine_host, "pause-engine": engine_host, "clock-jump": engine_host,
                  "master-etcd": engine_host,
                  "master-replicas": engine_host, "master-clients": engine_host,
                  "kill-etcd": rng.choice(self.placement.etcd), "pause-etcd": rng.choice(self.placement.etcd),
                  "master-replica-etcd": ",".join(sorted([engine_host, rng.choice(
                      [h for h in self.placement.engines if h != engine_host])])),
                  "etcd-minority": rng.choice(self.placement.etcd),
                  "etcd-majority": ",".join(sorted(rng.sample(self.placement.etcd, 2)))}.get(kind, "")
        return Fault(kind, target, hold_s, offset_s)

    def start(self, fault: Fault) -> None:
        """The fault in place, then noted (a send begun while a master was being killed may still
        be acknowledged by it)."""
        kind, target, bed, place = fault.kind, fault.target, self.bed, self.placement
        if kind == "kill-engine":
            self.engine_on(target).kill()
        elif kind == "pause-engine":
            signal_tree(self.engine_on(target).pid, signal.SIGSTOP)
        elif kind == "kill-etcd":
            self.brokers.etcd.kill_member(place.etcd.index(target))
        elif kind == "pause-etcd":
            signal_tree(self.etcd_pid(target), signal.SIGSTOP)
        elif kind == "master-etcd":
            bed.cut([target], place.etcd)
        elif kind == "master-replicas":
            bed.cut([target], [h for h in place.engines if h != target])
        elif kind == "master-clients":
            bed.cut([target], place.clients)
        elif kind == "master-replica-etcd":
            bed.cut(target.split(","), place.etcd)
        elif kind in ("etcd-minority", "etcd-majority"):
            cut_off = target.split(",")
            bed.cut(cut_off, [h for h in bed.hosts if h not in cut_off])
        elif kind in LATENCY:
            bed.delay_all(*LATENCY[kind])
        elif kind == "loss-5":
            for host in bed.hosts:
                bed.loss(host, 5)
        elif kind == "clock-jump":
            bed.jump_clock(target, fault.offset_s)  # in place within JUMP_SETTLE_S
        else:
            raise ValueError(f"no such fault: {kind}")
        self.history.note("nemesis", fault.kind, "start", fault.target)

    def heal(self, fault: Fault) -> None:
        kind, target = fault.kind, fault.target
        if kind == "kill-engine":
            self.engine_on(target).start()
        elif kind == "pause-engine":
            signal_tree(self.engine_on(target).pid, signal.SIGCONT)
        elif kind == "kill-etcd":
            k = self.placement.etcd.index(target)
            self.brokers.etcd.start_member(self.brokers.etcd.members[k])
        elif kind == "pause-etcd":
            signal_tree(self.etcd_pid(target), signal.SIGCONT)
        else:
            self.bed.heal()
        self.history.note("nemesis", kind, "heal", target)

    def engine_on(self, host: str) -> EngineProcess:
        return self.brokers.engines[self.placement.engines.index(host)]

    def etcd_pid(self, host: str) -> int:
        process = self.brokers.etcd.members[self.placement.etcd.index(host)].process
        assert process is not None, f"the etcd member on {host} is not running"
        return process.pid
