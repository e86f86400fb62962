"""A broker set in the simulation: three engines that elect their master on a model of etcd.

Each engine is a ``Member`` (a ``World`` whose actors go by ``b<broker_id>/<name>``) on one
network and one clock, with the real broker membership actor talking to ``EtcdModel``
(``etcd_model.py``). The member plays its supervisor's part as ``supervisor/supervisor.py``
does: it starts the membership actor alone, then the actors of the role it writes, and on a
``RoleChanged`` kills them, prepares the store (``prepare_for_role``: a replica's log is cut where
it forks from its new master's) and starts the new role's, recovering as after a crash.

Faults, drawn from the seed: an actor killed (the supervisor starts it again); a whole engine
killed (its supervisor too: it starts again later on a fresh run directory); an engine paused
(SIGSTOP: it gets no step while time goes on, so its lease may expire under it); a partition
between two parties of ``b0``, ``b1``, ``b2``, ``etcd`` and the client, healed later. The page
cache keeps what a killed process wrote: there is no power cut here (``pair.py`` cuts a
replica's power). The client sends, under SYNC or ASYNC replication, to whichever engine etcd
names master, and pulls.

Invariants, once every fault is healed and the set has settled:

* at most one engine answered ``PUT_OK`` in each epoch, and every record of the elected master's
  log that lies in an epoch's range was stored by that epoch's master (its STOREHOST port);
* every replica's log is the master's byte for byte up to the master's confirmed offset, and
  its queues and index agree with it;
* nothing answered ``PUT_OK`` is lost or moved (under ASYNC: nothing answered in an epoch below
  where the next one began), and nothing pulled changed (under SYNC readers stop at the confirm
  offset: what they see survives a failover; under ASYNC, within an epoch); ``checks.violations``;
* each engine's epoch file agrees with the set's history in etcd.
"""

from __future__ import annotations

import logging
import random
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import msgspec

from engine.actors.base import Coordination
from engine.actors.broker_membership import LEASE_FILE
from engine.actors.specs import MEMBERSHIP
from engine.config import StoreConfig
from engine.coordination.broker_set import BrokerSetKeys
from engine.coordination.role import ROLE_FILE, Role
from engine.ipc.endpoints import MASTER_ENDPOINT_FILE
from engine.store.commit_log import CommitLogReader, Damage
from engine.store.epoch_file import load_epochs
from engine.store.shared_offsets import CONFIRMED, EPOCH, WRITTEN
from harness.simulation.checks import violations
from harness.simulation.etcd_model import EtcdModel, ModelClient
from harness.simulation.network import CLIENT, party
from harness.simulation.pair import replica_violations, segment_differing
from harness.simulation.workload import TOPICS, Position, Stored, Workload
from harness.simulation.world import World, leftover_descriptors_closed, scratch_dir, sim_config

SET_SIZE = 3
ETCD = "etcd"
CLUSTER, BROKER = "sim", "set-a"
SETTLE_STEPS_MAX = 60_000


def member_config(base: StoreConfig, broker_id: int, mode: Literal["ASYNC", "SYNC"] = "SYNC") -> StoreConfig:
    port = 10911 + 100 * broker_id
    return base.replace(
        etcd_endpoints="http://sim-etcd:2379", cluster_name=CLUSTER, broker_name=BROKER, broker_id=broker_id,
        endpoint=f"tcp://127.0.0.1:{port}", store_port=port, replication_endpoint=f"tcp://sim-b{broker_id}:10912",
        replication_mode=mode, replication_report_interval_ms=100, replication_config_interval_ms=200,
        replica_lag_max_ms=1_500, sync_flush_timeout_ms=4_000).validate()


class Member(World):
    """One engine of the set; its supervisor is production's decisions (``supervision.py``)."""

    def __init__(self, root: Path, rng: random.Random, config: StoreConfig, etcd: EtcdModel, *,
                 beside: World | None) -> None:
        broker_id = config.broker_id
        super().__init__(root, rng, config, publication_loss_ratio=0.0, beside=beside, prefix=f"b{broker_id}/")
        self.broker_id = broker_id
        self.party = f"b{broker_id}"
        self.coordination = Coordination(lambda cfg: ModelClient(etcd, self.party))
        self.engine_down_since: int | None = None  # the step the whole engine was killed at
        self.paused_until = 0  # clock ms: SIGSTOPped until then
        self.membership = self.prefix + MEMBERSHIP

    @property
    def role(self) -> Role | None:
        return self.supervisor.role

    @property
    def running(self) -> bool:
        return self.engine_down_since is None and self.clock.mono_ms() >= self.paused_until

    def start_engine(self, *, crash_start: bool) -> None:
        """The supervisor's start: a fresh run directory, then what production's decisions say."""
        self.engine_down_since = None
        self.down.clear()
        self.slots.clear()
        for name in (ROLE_FILE, LEASE_FILE, MASTER_ENDPOINT_FILE):
            (self.run_dir / name).unlink(missing_ok=True)
        self.supervisor.start(crash_start=crash_start)

    def kill_engine(self) -> None:
        """SIGKILL to the supervisor's process group: every actor, the supervisor too."""
        for name in list(self.actors):
            self.kill(name)
        self.supervisor.died()
        self.down.clear()
        self.engine_down_since = self.counts.steps

    def follow_role(self) -> None:
        """The supervisor's part after a step: what its control socket holds (the role the
        membership actor tells), to production's decisions."""
        if self.engine_down_since is None:
            self.supervisor.take_control()


@dataclass
class SetPlan:
    steps: int = 1_000
    kill_ratio: float = 0.01  # an actor of a running engine
    engine_kill_ratio: float = 0.004
    pause_ratio: float = 0.003
    partition_ratio: float = 0.004
    heal_ratio: float = 0.01
    restart_after_steps: int = 10
    engine_restart_after_steps: int = 40
    send_ratio: float = 0.12
    pull_ratio: float = 0.04
    replication_mode: Literal["ASYNC", "SYNC"] = "SYNC"
    idle_ratio: float = 0.03  # no process runs for a while (100-400 ms): time for leases to run out

    @classmethod
    def drawn(cls, seed: int, **settled: Any) -> SetPlan:
        draw = random.Random(f"set plan {seed}")
        return replace(cls(
            kill_ratio=draw.choice((0.0, 0.005, 0.01, 0.03)),
            engine_kill_ratio=draw.choice((0.0, 0.003, 0.006, 0.012)),
            pause_ratio=draw.choice((0.0, 0.002, 0.005)),
            partition_ratio=draw.choice((0.0, 0.003, 0.008)),
            heal_ratio=draw.choice((0.005, 0.02)),
            restart_after_steps=draw.choice((1, 10, 30)),
            engine_restart_after_steps=draw.choice((20, 60, 150)),
        ), **settled)


@dataclass
class SetOutcome:
    seed: int
    violations: list[str]
    figures: dict[str, int] = field(default_factory=dict)
    trace: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


class BrokerSetRun:
    def __init__(self, root: Path, rng: random.Random, plan: SetPlan) -> None:
        self.rng = rng
        self.plan = plan
        base = sim_config(rng.choice(["ASYNC_FLUSH", "SYNC_FLUSH"]))
        self.etcd = EtcdModel()
        self.members: list[Member] = []
        for broker_id in range(SET_SIZE):
            self.members.append(Member(root, rng, member_config(base, broker_id, plan.replication_mode), self.etcd,
                                       beside=self.members[0] if self.members else None))
        self.etcd.clock = self.members[0].clock
        self.network = self.members[0].network
        self.etcd.partitioned = lambda who: frozenset((who, ETCD)) in self.network.partitions
        self.keys = BrokerSetKeys(CLUSTER, BROKER)
        # SYNC: every PUT_OK is a promise (the workload checks it). ASYNC: only what the next epoch's
        # master held when elected (``promised_under_async``): the client forgets the rest at a new epoch.
        self.sync = plan.replication_mode == "SYNC"
        self.acks: list[tuple[int, int, Position, bytes]] = []  # (epoch, offset, position, body) of each PUT_OK
        self.workload = Workload(rng, self.network, sync_flush=self.sync,
                                 attempts_max=base.max_delivery_attempts, front="b0/front")
        self.network.to_client = self.on_reply
        self.answered: dict[int, set[int]] = {}  # epoch -> the brokers that answered PUT_OK in it
        self.topics_for_epoch = 0
        for member in self.members:
            member.on_kill = self.workload.kill
        self.pauses = self.partitions = self.engine_kills = 0

    # -- the client ------------------------------------------------------------------

    def on_reply(self, frames: list[bytes], sender: str) -> None:
        reply = msgspec.msgpack.decode(frames[-1])
        asked = self.workload.waiting.get(reply.get("id"))
        if reply.get("ok") and asked is not None and asked[0] == "send":
            member = self.members[int(party(sender)[1:])]
            epoch = member.slots.get(EPOCH)
            for (body, _key), result in zip(asked[2], reply["results"], strict=True):
                if result["status"] == "PUT_OK":
                    self.answered.setdefault(epoch, set()).add(member.broker_id)
                    position = (asked[1], result["queue_id"], result["queue_offset"])
                    self.acks.append((epoch, result["commit_log_offset"], position, body))
        self.workload.on_reply(frames, sender)
        if not self.sync:  # judged at the end, by epoch (``promised_under_async``)
            self.workload.unsettled.clear()

    def promised_under_async(self, history: dict[int, tuple[int, int]]) -> None:
        """ASYNC: a PUT_OK of epoch e survives if it lies below where epoch e + 1 began (the next
        master held it then); the last epoch's all do (no master kill follows the settling)."""
        starts = sorted(history)
        for epoch, offset, position, body in self.acks:
            later = [history[e][0] for e in starts if e > epoch]
            if not later or offset < later[0]:
                self.workload.durable[position] = Stored(body, "", offset)

    def master_front(self) -> str | None:
        """Where the client sends: the master etcd names (its route), once it serves."""
        master = self.etcd.get(self.keys.master)
        if master is None:
            return None
        if master["epoch"] != self.topics_for_epoch:  # a new master: the topics again (a no-op where they are)
            self.topics_for_epoch = master["epoch"]
            if not self.sync:  # what was read may be gone with the old master's tail: older reads are void
                for topic in TOPICS:
                    self.workload.void_reads(topic)
            self.workload.front = f"b{master['broker_id']}/front"
            self.workload.create_topics()
        return f"b{master['broker_id']}/front"

    # -- steps -------------------------------------------------------------------------

    def running(self) -> list[Member]:
        return [member for member in self.members if member.running]

    def work_one(self, *, client: bool) -> None:
        """One step of work without faults: a delivery, a backlog slice, a flush, the client's, or a tick."""
        roll = self.rng.random()
        if client and roll > 1 - self.plan.idle_ratio:
            self.members[0].clock.advance(self.rng.randrange(100, 400))
            return
        if client and roll < self.plan.send_ratio + self.plan.pull_ratio:
            front = self.master_front()
            if front is not None:
                self.workload.front = front
                self.workload.send() if roll < self.plan.send_ratio else self.workload.pull()
            return
        running = self.running()
        self.rng.shuffle(running)
        for member in running:
            if member.deliver(may_die=False) or member.backlog_one() or member.job_one():
                member.follow_role()
                return
        self.tick_one()

    def tick_one(self) -> None:
        """The next tick due of any running engine (time goes on to it); a paused engine's come later."""
        candidates = [(member.next_tick[name], member) for member in self.running() for name in member.actors]
        resume = [member.paused_until for member in self.members
                  if member.engine_down_since is None and member.paused_until > member.clock.mono_ms()]
        if not candidates or (resume and min(resume) < min(due for due, _ in candidates)):
            clock = self.members[0].clock
            clock.advance(max(1, min(resume or [clock.mono_ms() + 100]) - clock.mono_ms()))
            return
        _, member = min(candidates, key=lambda pair: (pair[0], self.rng.random()))
        member.tick_one()
        member.follow_role()

    def fault(self) -> bool:
        plan, rng = self.plan, self.rng
        roll = rng.random()
        for ratio, action in ((plan.kill_ratio, self.kill_actor), (plan.engine_kill_ratio, self.kill_engine),
                              (plan.pause_ratio, self.pause), (plan.partition_ratio, self.partition),
                              (plan.heal_ratio, self.heal_one)):
            if roll < ratio:
                action()
                return True
            roll -= ratio
        return False

    def kill_actor(self) -> None:
        names = [(member, name) for member in self.running() for name in member.actors]
        if names:
            member, name = names[self.rng.randrange(len(names))]
            member.trace(f"kill {name}")
            member.kill(name)

    def kill_engine(self) -> None:
        running = [member for member in self.members if member.engine_down_since is None]
        if len(running) > 1:
            member = self.rng.choice(running)
            member.trace(f"kill engine {member.party}")
            member.kill_engine()
            self.engine_kills += 1

    def pause(self) -> None:
        running = self.running()
        if running:
            member = self.rng.choice(running)
            ms = self.rng.choice((500, 2_500, 6_000))
            member.paused_until = member.clock.mono_ms() + ms
            member.trace(f"pause {member.party} for {ms} ms")
            self.pauses += 1

    def partition(self) -> None:
        parties = [member.party for member in self.members] + [ETCD, CLIENT]
        one, other = self.rng.sample(parties, 2)
        self.network.partitions.add(frozenset((one, other)))
        self.members[0].trace(f"partition {one} | {other}")
        self.partitions += 1

    def heal_one(self) -> None:
        if self.network.partitions:
            pair = self.rng.choice(sorted(self.network.partitions, key=sorted))
            self.network.partitions.discard(pair)
            self.members[0].trace(f"heal {' | '.join(sorted(pair))}")

    def restarts(self) -> None:
        step = self.members[0].counts.steps
        for member in self.members:
            if member.engine_down_since is not None:
                if step - member.engine_down_since >= self.plan.engine_restart_after_steps:
                    member.trace(f"start engine {member.party}")
                    member.start_engine(crash_start=True)
                continue
            if not member.running:
                continue
            for name, since in list(member.down.items()):
                if step - since >= self.plan.restart_after_steps and name in member.specs:
                    member.trace(f"restart {name}")
                    member.start(name)
            member.follow_role()

    # -- the run ------------------------------------------------------------------------

    def run(self) -> list[str]:
        for member in self.members:
            member.start_engine(crash_start=False)
        for step in range(self.plan.steps):
            for member in self.members:
                member.counts.steps = step
            self.restarts()
            if not self.fault():
                self.work_one(client=True)
            self.workload.violations += self.kept_follows_checked()
            if self.workload.violations:
                return list(self.workload.violations)
        return self.settled_checks()

    def kept_follows_checked(self) -> list[str]:
        """A replica that followed a new master with its actors kept (``ForkCheck``) held then a
        prefix of that master's log, byte for byte: compared here with the master's files, not with
        the epochs ``fork_point`` reads."""
        found = [f"{member.party}: kept its actors to follow broker {role.master_id} in epoch {role.epoch}, its "
                 f"log (to {end}) not a prefix of that master's"
                 for member in self.members for role, end in member.supervisor.kept_since
                 if segment_differing(member, self.members[role.master_id], end) is not None]
        for member in self.members:
            member.supervisor.kept_since.clear()
        return found

    def settle(self) -> Member | None:
        """Every fault healed; run until one master serves, every other engine follows it in its
        epoch with its log where the master's is, and every engine is quiet."""
        self.network.partitions.clear()
        for member in self.members:
            member.paused_until = 0
            if member.engine_down_since is not None:
                member.start_engine(crash_start=True)
        for turn in range(SETTLE_STEPS_MAX):
            for member in self.members:
                for name in list(member.down):
                    if name in member.specs:
                        member.start(name)
                member.follow_role()
            self.work_one(client=False)
            if turn % 50 == 0 and (master := self.settled_master()) is not None:
                return master
        return None

    def settled_master(self) -> Member | None:
        masters = [m for m in self.members if m.role is not None and m.role.is_master]
        if len(masters) != 1:
            return None
        master = masters[0]
        assert master.role is not None
        named = self.etcd.get(self.keys.master)
        if named is None or named["broker_id"] != master.broker_id or named["epoch"] != master.role.epoch:
            return None
        end = master.slots.get(CONFIRMED)
        for member in self.members:
            if member.role is None or member.role.epoch != master.role.epoch or member.down or not member.running:
                return None
            if member is not master and member.slots.get(WRITTEN) != end:
                return None
        if self.network.busy() or not all(member.quiet() for member in self.members):
            return None
        return master

    def describe(self) -> str:
        """Each engine's role and offsets, and the master etcd names: why a set does not settle."""
        parts = [f"etcd names {self.etcd.get(self.keys.master)}, in sync {self.etcd.get(self.keys.in_sync)}"]
        for m in self.members:
            role = f"{m.role.role} of epoch {m.role.epoch}" if m.role else "no role"
            parts.append(f"{m.party}: {role}, written {m.slots.get(WRITTEN)}, confirmed {m.slots.get(CONFIRMED)}, "
                         f"quiet {m.quiet()}, down {sorted(m.down)}, epoch slot {m.slots.get(EPOCH)}")
        return "; ".join(parts)

    def settled_checks(self) -> list[str]:
        master = self.settle()
        if master is None:
            return [f"the broker set did not settle: {self.describe()}"]
        history = {int(key.rsplit("/", 1)[-1]): (value["start_offset"], value["broker_id"])
                   for key, value in self.etcd.get_prefix(self.keys.epochs).items()}
        if not self.sync:
            self.promised_under_async(history)
        found = [f"{master.party} (master): {v}" for v in violations(
            master.store_dir, master.config, self.workload, master.slots.get(CONFIRMED))]
        for member in self.members:
            if member is not master:
                found += [f"{member.party}: {v}" for v in replica_violations(master, member, self.workload)]
        found += [f"epoch {epoch}: PUT_OK from brokers {sorted(ids)}" for epoch, ids in sorted(self.answered.items())
                  if len(ids) > 1]
        found += self.writers_by_epoch(master, history)
        for member in self.members:
            for epoch, start in load_epochs(member.store_dir):
                if epoch not in history or history[epoch][0] != start:
                    found.append(f"{member.party}: its epoch file has epoch {epoch} at {start}; etcd: "
                                 f"{history.get(epoch)}")
        return found

    def writers_by_epoch(self, master: Member, history: dict[int, tuple[int, int]]) -> list[str]:
        """Every record in an epoch's range of the log was stored by that epoch's master."""
        ports = {member.broker_id: member.config.store_port for member in self.members}
        starts = sorted((start, epoch) for epoch, (start, _) in history.items())
        reader = CommitLogReader.for_config(master.store_dir, master.config)
        try:
            for item in reader.scan(reader.min_offset(), master.slots.get(CONFIRMED)):
                if isinstance(item, Damage):
                    continue
                epochs = [epoch for start, epoch in starts if start <= item.commit_log_offset]
                if not epochs:
                    continue
                expected = ports[history[epochs[-1]][1]]
                if item.store_host.port != expected:
                    return [f"log: the record at {item.commit_log_offset} (epoch {epochs[-1]}) was stored by "
                            f"port {item.store_host.port}, not by that epoch's master ({expected})"]
        finally:
            reader.segments.close()
        return []


def simulate_set(seed: int, plan: SetPlan | None = None, *, root: Path | None = None) -> SetOutcome:
    plan = plan or SetPlan.drawn(seed)
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix=f"sim-set-{seed}-", dir=root or scratch_dir()))
    quiet = logging.getLogger("engine")
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        run = BrokerSetRun(workdir, rng, plan)
        with leftover_descriptors_closed():
            found = run.run()
        counts = run.members[0].counts
        figures = {"steps": counts.steps, "sim_ms": run.members[0].clock.mono_ms() - 1_000_000,
                   "kills": counts.kills, "restarts": counts.restarts,
                   "engine_kills": run.engine_kills, "pauses": run.pauses, "partitions": run.partitions,
                   "cuts": sum(member.supervisor.cuts for member in run.members),
                   "follows_kept": sum(member.supervisor.follows_kept for member in run.members),
                   "acked": run.workload.acked,
                   "pulled": run.workload.pulled, "epochs": len(run.answered),
                   "partitioned_drops": run.network.partitioned_drops, "etcd_requests": run.etcd.requests}
        return SetOutcome(seed, found, figures, counts.trace)
    finally:
        quiet.level = level
        shutil.rmtree(workdir, ignore_errors=True)

