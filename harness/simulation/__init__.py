"""A seeded simulation of the engine: the orderings that crashes produce, replayed from one number.

Every actor's logic (``engine/actors``) runs in this process over a simulated
network (``network.py``) and a simulated disk (``disk.py``), with simulated time
and no threads (``world.py``). A seed chooses the flush mode, the order of every
delivery, tick and background flush, the client's sends and pulls
(``workload.py``), and when actors are killed and the power is cut. After every
recovery and at the end, the engine is left to settle and the invariants are
checked on its files (``checks.py``). The same seed replays the same run.

``python scripts/simulate.py --seeds 1000`` runs many seeds and prints any that fail.
"""

from __future__ import annotations

import logging
import random
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from engine.local_reads import LocalReads
from engine.store.shared_offsets import CONFIRMED, FLUSHED
from harness.simulation.checks import delayed_arrivals, violations
from harness.simulation.pair import (
    disks_listening,
    master_config_for,
    pass_time_pair,
    replica_beside,
    replica_violations,
    settle_pair,
)
from harness.simulation.workload import Workload
from harness.simulation.world import World, leftover_descriptors_closed, scratch_dir, sim_config

# What an ordinary step does, and how often (weights): the fixed mix every seed ran before the
# plan was drawn from the seed, kept for the seeds pinned under it.
WORK = ("delete_topic", "send", "send_delayed", "send_half", "pull", "pop", "tick", "flush", "backlog", "deliver")
FIXED_MIX = (0.003, 0.117, 0.02, 0.01, 0.04, 0.03, 0.08, 0.06, 0.04, 0.6)
# How much of each kind of work a drawn plan keeps (swarm testing: some seeds do none of it).
_MIX_FACTORS = {"delete_topic": (0, 0.25, 1, 4), "send": (0.25, 1, 4), "send_delayed": (0, 0.25, 1, 4),
                "send_half": (0, 0.25, 1, 4), "pull": (0, 0.25, 1, 4), "pop": (0, 0.25, 1, 4, 8),
                "tick": (0.25, 1, 4), "flush": (0.25, 1, 4), "backlog": (0.25, 1, 4), "deliver": (0.25, 1, 2)}
DIRECT_CLIENT_SHARE = 0.5  # of drawn plans: a client the writer and the owners answer past the front


@dataclass
class Plan:
    """How much happens in one run, and how often things go wrong (per step).

    ``Plan()`` is the fixed plan every seed once ran; ``Plan.drawn(seed)``, which ``simulate``
    uses, draws each rate from the seed (swarm testing, as TigerBeetle's simulator does): one
    seed kills actors often and never cuts the power, another cuts it after acks, another
    stops the engine cleanly, another loses no publication, so that each fault is also met
    alone and in numbers that a mix of every fault at a low rate never reaches."""

    steps: int = 400
    kill_ratio: float = 0.01
    power_cut_ratio: float = 0.004
    clean_stop_ratio: float = 0.0  # the whole engine stopped in order, then started again
    power_off_after_stop_ratio: float = 0.5  # of clean stops: the power goes before the start
    cut_after_ack_ratio: float = 0.0  # of answered acks: a power cut within three steps
    page_written_back_ratio: float = 1 / 3  # of the pages written since their last sync, at a power cut
    # the supervisor SIGKILLed: every actor stops on its own, then the engine starts again. Off by
    # default, so that each seed keeps the run it always had; the pinned regression seeds turn it on
    supervisor_death_ratio: float = 0.0
    publication_loss_ratio: float = 0.02
    restart_after_steps: int = 10
    pop_topic_ratio: float = 0.0  # of sends: to the pop groups' topic (the others go to any topic)
    mix: tuple[float, ...] = FIXED_MIX  # the weight of each kind of ``WORK``
    flush_mode: str | None = None  # None: the seed picks one (a planted bug of one mode sets it)
    # A replica follows the engine (``pair.py``): kills fall on both, power cuts on the replica only.
    # Off unless asked for (``simulate.py --replica``), so that every seed keeps the run it had.
    replica: bool = False
    replication_mode: Literal["ASYNC", "SYNC"] = "ASYNC"
    # The client is answered past the front by the writer and the owners (``workload.py``). Off in
    # ``Plan()``; drawn last in ``Plan.drawn``, so that a seed that draws it off keeps its run.
    direct_client: bool = False

    @classmethod
    def drawn(cls, seed: int, **settled: Any) -> Plan:
        """The plan of ``seed``, each rate drawn from it (``settled`` overrides some)."""
        draw = random.Random(f"plan {seed}")  # its own generator: the run's draws stay as they were

        def rate(low: float, high: float, none: float) -> float:
            """0 for a share ``none`` of the seeds, else between low and high (log-uniform)."""
            return 0.0 if draw.random() < none else round(low * (high / low) ** draw.random(), 5)

        plan = cls(
            kill_ratio=rate(0.002, 0.05, none=0.2),
            power_cut_ratio=rate(0.001, 0.02, none=0.25),
            clean_stop_ratio=rate(0.001, 0.01, none=0.4),
            power_off_after_stop_ratio=draw.choice((0.0, 0.5, 1.0)),
            cut_after_ack_ratio=rate(0.05, 0.5, none=0.7),
            page_written_back_ratio=draw.choice((0.0, 1 / 3, 2 / 3)),
            publication_loss_ratio=rate(0.005, 0.1, none=0.3),
            restart_after_steps=draw.choice((1, 3, 10, 30)),
            pop_topic_ratio=draw.choice((0.0, 0.0, 0.5, 0.9)),
            mix=tuple(round(weight * draw.choice(_MIX_FACTORS[work]), 5)
                      for work, weight in zip(WORK, FIXED_MIX, strict=True)),
        )
        if draw.random() < 0.5:  # the pop groups hammered: many pops and acks, a power cut soon after an ack
            hammered = {"pop": 8 * FIXED_MIX[5], "send": 2 * FIXED_MIX[1], "deliver": 2 * FIXED_MIX[-1],
                        "delete_topic": 0}
            plan = replace(plan, cut_after_ack_ratio=round(draw.uniform(0.3, 1.0), 5), pop_topic_ratio=0.9,
                           mix=tuple(hammered.get(work, weight) for work, weight in zip(WORK, plan.mix, strict=True)))
        plan = replace(plan, direct_client=draw.random() < DIRECT_CLIENT_SHARE)
        return replace(plan, **settled)

    def describe(self) -> str:
        total = sum(self.mix)
        mix = " ".join(f"{work} {weight / total:.3f}" for work, weight in zip(WORK, self.mix, strict=True))
        return (f"kill {self.kill_ratio}, power cut {self.power_cut_ratio}, clean stop {self.clean_stop_ratio} "
                f"(power off after {self.power_off_after_stop_ratio}), cut after an ack {self.cut_after_ack_ratio}, "
                f"pages written back {self.page_written_back_ratio:.2f}, publications lost "
                f"{self.publication_loss_ratio}, restart after {self.restart_after_steps} steps, sends to the "
                f"pop topic {self.pop_topic_ratio}; mix: {mix}"
                + (f"; a replica ({self.replication_mode})" if self.replica else "")
                + ("; a client answered past the front" if self.direct_client else ""))


@dataclass
class Outcome:
    seed: int
    flush_mode: str
    violations: list[str]
    figures: dict[str, int] = field(default_factory=dict)
    trace: list[str] = field(default_factory=list)
    plan: Plan = field(default_factory=Plan)

    @property
    def ok(self) -> bool:
        return not self.violations


class HostReader:
    """A reader on the engine's host (``LocalReads`` over the store's mapped files, as a consumer
    in another process has it): opened at its first pull, it stays over actor kills and engine
    restarts, and goes with the power (the host's processes die with it)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.reads: LocalReads | None = None

    def __call__(self) -> LocalReads:
        if self.reads is None:
            world = self.world
            self.reads = LocalReads(world.store_dir, run_dir=world.run_dir, config=world.config)
        return self.reads

    def power_lost(self) -> None:
        if self.reads is not None:
            self.reads.close()
            self.reads = None


def simulate(seed: int, plan: Plan | None = None, *, root: Path | None = None) -> Outcome:
    """Run one seed; the outcome lists every invariant it broke (none when it passes)."""
    plan = plan or Plan.drawn(seed)
    rng = random.Random(seed)
    flush_mode = rng.choice(["ASYNC_FLUSH", "SYNC_FLUSH"])  # drawn even when the plan sets it: the same run after
    flush_mode = plan.flush_mode or flush_mode
    workdir = Path(tempfile.mkdtemp(prefix=f"sim-{seed}-", dir=root or scratch_dir()))
    quiet = logging.getLogger("engine")
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        config = sim_config(flush_mode)
        if plan.replica:
            config = master_config_for(config, plan.replication_mode)
        world = World(workdir, rng, config, publication_loss_ratio=plan.publication_loss_ratio,
                      page_written_back_ratio=plan.page_written_back_ratio)
        replica = replica_beside(world, workdir, rng, page_written_back_ratio=plan.page_written_back_ratio) \
            if plan.replica else None
        reader = HostReader(world)
        workload = Workload(rng, world.network, world.config.flush_mode == "SYNC_FLUSH",
                            attempts_max=world.config.max_delivery_attempts, pop_topic_ratio=plan.pop_topic_ratio,
                            local_reads=reader, direct=plan.direct_client)
        with disks_listening(world, replica), leftover_descriptors_closed():
            try:
                found = _run(world, workload, rng, plan, replica)
            finally:
                reader.power_lost()
        counts = world.counts
        figures = {"steps": counts.steps, "deliveries": counts.deliveries, "kills": counts.kills,
                   "restarts": counts.restarts, "power_cuts": counts.power_cuts,
                   "clean_stops": counts.clean_stops, "supervisor_deaths": counts.supervisor_deaths,
                   "sync_jobs": counts.sync_jobs,
                   "pages_lost": sum(w.disk.pages_lost for w in (world, replica) if w),
                   "pages_torn": sum(w.disk.pages_torn for w in (world, replica) if w),
                   "publications_lost": world.network.publications_lost, "acked": workload.acked,
                   "pulled": workload.pulled, "local_pulled": workload.local_pulled, "popped": workload.popped,
                   "pop_acked": workload.pop_acked, "topic_deletions": workload.deletions,
                   "direct_answers": workload.direct_answers, "straight_sends": workload.straight_sends,
                   "passed_back": workload.passed_back}
        return Outcome(seed, flush_mode, found, figures, counts.trace, plan)
    finally:
        quiet.level = level
        shutil.rmtree(workdir, ignore_errors=True)


def _run(world: World, workload: Workload, rng: random.Random, plan: Plan, replica: World | None = None) -> list[str]:
    world.on_kill = workload.kill
    world.start_all()
    workload.create_topics()
    if replica is not None:
        replica.start_all()
    if not (settle_pair(world, replica) if replica else world.settle()):
        return ["the engine did not settle after its start"]
    found: list[str] = []
    cut_at, acks_seen = None, 0  # a power cut planned after an ack, and the acks answered so far
    for step in range(plan.steps):
        world.counts.steps = step
        roll = rng.random()
        if step == cut_at or plan.clean_stop_ratio <= roll < plan.clean_stop_ratio + plan.power_cut_ratio:
            cut_at = None
            found += _power_cut(world, workload, replica)
        elif roll < plan.clean_stop_ratio:
            found += _clean_stop(world, workload, rng, plan, replica)
        elif roll < plan.clean_stop_ratio + plan.power_cut_ratio + plan.kill_ratio and world.actors:
            worlds = [world] if replica is None else [world, replica]
            name = rng.choice(sorted(name for each in worlds for name in each.actors))
            owner = replica if replica is not None and name in replica.actors else world
            owner.trace(f"kill {name}")
            owner.kill(name)
        elif plan.power_cut_ratio + plan.kill_ratio <= roll \
                < plan.power_cut_ratio + plan.kill_ratio + plan.supervisor_death_ratio:
            world.trace("the supervisor dies")
            world.supervisor_death()
            found += _settled_check(world, workload, "after the supervisor died", replica)
        else:
            _ordinary_step(world, workload, rng, plan, replica)
        if found:
            return found
        if workload.pop_acked > acks_seen and plan.cut_after_ack_ratio and cut_at is None \
                and rng.random() < plan.cut_after_ack_ratio:
            cut_at = step + rng.randint(1, 3)
        acks_seen = workload.pop_acked
    if replica is None:
        world.pass_time(8_000)  # every delayed message due, every move lost with a front timed out
    else:
        pass_time_pair(world, replica, 8_000)
    found += _settled_check(world, workload, "at the end", replica)
    found += [f"at the end: {v}" for v in delayed_arrivals(world.store_dir, world.config, workload)]
    return found


def _power_cut(world: World, workload: Workload, replica: World | None = None) -> list[str]:
    if replica is not None:  # the replica's power: the master keeps every byte it shipped
        replica.trace("power cut (the replica)")
        replica.power_cut()
        return _settled_check(world, workload, "after a power cut of the replica", replica)
    world.trace("power cut")
    workload.power_cut(world.slots.get(FLUSHED))
    _host_reader_lost(workload)
    world.power_cut()
    return _settled_check(world, workload, "after a power cut")


def _clean_stop(world: World, workload: Workload, rng: random.Random, plan: Plan,
                replica: World | None = None) -> list[str]:
    """The supervisor's stop (every actor in reverse start order), and sometimes the power off
    before the next start. A clean stop flushes: whatever was answered before it survives, in
    either flush mode. One that is not clean (an actor was down) promises what a cut does.
    A master with a replica keeps its power: it must not lose bytes it shipped."""
    power_off = rng.random() < plan.power_off_after_stop_ratio and replica is None
    flushed_before = world.slots.get(FLUSHED)
    clean = world.stop_all()
    world.trace(f"{'clean' if clean else 'unclean'} stop{', power off' if power_off else ''}")
    if clean:
        workload.clean_stop()
    elif power_off:
        workload.power_cut(max(flushed_before, world.slots.get(FLUSHED)))
    if power_off:
        _host_reader_lost(workload)
    world.start_after_stop(clean=clean, power_off=power_off)
    return _settled_check(world, workload, f"after {'a clean' if clean else 'an unclean'} stop", replica)


def _host_reader_lost(workload: Workload) -> None:
    if isinstance(workload.local_reads, HostReader):
        workload.local_reads.power_lost()


def _ordinary_step(world: World, workload: Workload, rng: random.Random, plan: Plan,
                   replica: World | None = None) -> None:
    for each in [world] if replica is None else [world, replica]:
        for name, since in list(each.down.items()):
            if each.counts.steps - since >= plan.restart_after_steps:
                each.trace(f"restart {name}")
                each.start(name)
    if replica is not None and rng.random() < 0.5:
        world = replica  # the replica's turn for a tick, a flush, a backlog slice or a delivery
    roll = rng.random() * sum(plan.mix)
    work = WORK[-1]
    for kind, weight in zip(WORK, plan.mix, strict=True):
        if roll < weight:
            work = kind
            break
        roll -= weight
    if work == "delete_topic":
        workload.delete_topic()
    elif work == "send":
        workload.send()
    elif work == "send_delayed":
        workload.send_delayed()
    elif work == "send_half":
        workload.send_half()
    elif work == "pull":
        workload.pull()
    elif work == "pop":
        workload.pop()
    elif work == "tick":
        world.tick_one()
    elif work == "flush":
        if not world.job_one():
            world.tick_one()
    elif work == "backlog":
        if not world.backlog_one():
            world.tick_one()
    elif not world.deliver(may_die=rng.random() < plan.kill_ratio * 5):
        world.tick_one()


def _settled_check(world: World, workload: Workload, when: str, replica: World | None = None) -> list[str]:
    if not (settle_pair(world, replica) if replica else world.settle()):
        return [f"the engine did not settle {when}"]
    found = violations(world.store_dir, world.config, workload, world.slots.get(CONFIRMED))
    if replica is not None:
        found += replica_violations(world, replica, workload)
    return [f"{when}: {v}" for v in found]
