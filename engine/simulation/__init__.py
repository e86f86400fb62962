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

import contextlib
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.simulation.checks import delayed_arrivals, violations
from engine.simulation.workload import Workload
from engine.simulation.world import World, sim_config
from engine.store.shared_offsets import CONFIRMED, FLUSHED


@dataclass
class Plan:
    """How much happens in one run, and how often things go wrong (per step)."""

    steps: int = 400
    kill_ratio: float = 0.01
    power_cut_ratio: float = 0.004
    # the supervisor SIGKILLed: every actor stops on its own, then the engine starts again. Off by
    # default, so that each seed keeps the run it always had; the pinned regression seeds turn it on
    supervisor_death_ratio: float = 0.0
    publication_loss_ratio: float = 0.02
    restart_after_steps: int = 10
    flush_mode: str | None = None  # None: the seed picks one (a planted bug of one mode sets it)


@dataclass
class Outcome:
    seed: int
    flush_mode: str
    violations: list[str]
    figures: dict[str, int] = field(default_factory=dict)
    trace: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def simulate(seed: int, plan: Plan | None = None, *, root: Path | None = None) -> Outcome:
    """Run one seed; the outcome lists every invariant it broke (none when it passes)."""
    plan = plan or Plan()
    rng = random.Random(seed)
    flush_mode = rng.choice(["ASYNC_FLUSH", "SYNC_FLUSH"])  # drawn even when the plan sets it: the same run after
    flush_mode = plan.flush_mode or flush_mode
    workdir = Path(tempfile.mkdtemp(prefix=f"sim-{seed}-", dir=root or _tmpfs()))
    quiet = logging.getLogger("engine")
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        world = World(workdir, rng, sim_config(flush_mode), publication_loss_ratio=plan.publication_loss_ratio)
        workload = Workload(rng, world.network, world.config.flush_mode == "SYNC_FLUSH",
                            attempts_max=world.config.max_delivery_attempts)
        with world.disk, _leftover_descriptors_closed():
            found = _run(world, workload, rng, plan)
        counts = world.counts
        figures = {"steps": counts.steps, "deliveries": counts.deliveries, "kills": counts.kills,
                   "restarts": counts.restarts, "power_cuts": counts.power_cuts,
                   "supervisor_deaths": counts.supervisor_deaths, "sync_jobs": counts.sync_jobs,
                   "pages_lost": world.disk.pages_lost, "pages_torn": world.disk.pages_torn,
                   "publications_lost": world.network.publications_lost, "acked": workload.acked,
                   "pulled": workload.pulled, "popped": workload.popped, "pop_acked": workload.pop_acked,
                   "topic_deletions": workload.deletions}
        return Outcome(seed, flush_mode, found, figures, counts.trace)
    finally:
        quiet.level = level
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def _leftover_descriptors_closed() -> Iterator[None]:
    """Close, at the end of a run, the descriptors its actors opened and never closed.

    A killed actor's objects are dropped, not shut down, as a SIGKILL leaves them; the kernel
    would close a dead process's descriptors, and here this does. Without it each run leaked
    dozens (segments, pop journals), and a few hundred runs in one process met the limit."""
    opened: set[int] = set()
    real_open, real_close = os.open, os.close

    def tracked_open(*args: Any, **kwargs: Any) -> int:
        fd = real_open(*args, **kwargs)
        opened.add(fd)
        return fd

    def tracked_close(fd: int) -> None:
        opened.discard(fd)
        real_close(fd)

    os.open, os.close = tracked_open, tracked_close
    try:
        yield
    finally:
        os.open, os.close = real_open, real_close
        for fd in opened:
            with contextlib.suppress(OSError):
                real_close(fd)


def _run(world: World, workload: Workload, rng: random.Random, plan: Plan) -> list[str]:
    world.on_kill = workload.kill
    world.start_all()
    workload.create_topics()
    if not world.settle():
        return ["the engine did not settle after its start"]
    found: list[str] = []
    for step in range(plan.steps):
        world.counts.steps = step
        roll = rng.random()
        if roll < plan.power_cut_ratio:
            world.trace("power cut")
            workload.power_cut(world.slots.get(FLUSHED))
            world.power_cut()
            found += _settled_check(world, workload, "after a power cut")
        elif roll < plan.power_cut_ratio + plan.kill_ratio and world.actors:
            name = rng.choice(sorted(world.actors))
            world.trace(f"kill {name}")
            world.kill(name)
        elif plan.power_cut_ratio + plan.kill_ratio <= roll \
                < plan.power_cut_ratio + plan.kill_ratio + plan.supervisor_death_ratio:
            world.trace("the supervisor dies")
            world.supervisor_death()
            found += _settled_check(world, workload, "after the supervisor died")
        else:
            _ordinary_step(world, workload, rng, plan)
        if found:
            return found
    world.pass_time(8_000)  # every delayed message due, every move lost with a front timed out
    found += _settled_check(world, workload, "at the end")
    found += [f"at the end: {v}" for v in delayed_arrivals(world.store_dir, world.config, workload)]
    return found


def _ordinary_step(world: World, workload: Workload, rng: random.Random, plan: Plan) -> None:
    for name, since in list(world.down.items()):
        if world.counts.steps - since >= plan.restart_after_steps:
            world.trace(f"restart {name}")
            world.start(name)
    roll = rng.random()
    if roll < 0.003:
        workload.delete_topic()
    elif roll < 0.12:
        workload.send()
    elif roll < 0.14:
        workload.send_delayed()
    elif roll < 0.15:
        workload.send_half()
    elif roll < 0.19:
        workload.pull()
    elif roll < 0.22:
        workload.pop()
    elif roll < 0.30:
        world.tick_one()
    elif roll < 0.36:
        if not world.job_one():
            world.tick_one()
    elif roll < 0.40:
        if not world.backlog_one():
            world.tick_one()
    elif not world.deliver(may_die=rng.random() < plan.kill_ratio * 5):
        world.tick_one()


def _settled_check(world: World, workload: Workload, when: str) -> list[str]:
    if not world.settle():
        return [f"the engine did not settle {when}"]
    found = violations(world.store_dir, world.config, workload, world.slots.get(CONFIRMED))
    return [f"{when}: {v}" for v in found]


def _tmpfs() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None
