"""The simulated engine: every actor's logic in one process, driven step by step from one seed.

A step is one of: deliver a few queued messages to an actor (then its ``drained``),
run an actor's tick, run one pending background flush, give an actor a slice of its
backlog, let the client send or pull, kill an actor, restart a killed one, or cut the
power (every actor dies, the disk loses or tears what was not synced, and the engine
starts again in the supervisor's order). Time is simulated; nothing runs in a thread;
the same seed gives the same run, byte for byte.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.actors.base import Actor, Clock, Coordination, Env, Port, Waker
from engine.actors.effects import Effects, Exit, Tell
from engine.actors.specs import ActorSpec, actor_specs
from engine.config import KiB, StoreConfig
from engine.ipc import direct_replies
from engine.ipc.channels import Channel
from engine.ipc.lifecycle import Lifecycle, actor_step
from engine.store.checkpoint import load_checkpoint
from engine.store.shared_offsets import (
    CONFIRMED,
    DISPATCHED,
    FLUSHED,
    INDEX_APPLIED,
    INDEX_DURABLE,
    OFFSETS_FILE,
    SharedOffsets,
    owner_durable_slot,
    owner_slot,
)
from harness.simulation.disk import SimDisk
from harness.simulation.network import Network
from harness.simulation.supervision import SimSupervisor
from harness.simulation.workload import FIFO_GROUP

DELIVERIES_PER_STEP_MAX = 8


class SimClock(Clock):
    """Both clocks of the host, moved by the world only."""

    def __init__(self, wall_ms: int) -> None:
        self.mono = 1_000_000
        self.wall = wall_ms

    def mono_ms(self) -> int:
        return self.mono

    def wall_ms(self) -> int:
        return self.wall

    def advance(self, ms: int) -> None:
        self.mono += ms
        self.wall += ms


@dataclass
class SyncJob:
    actor: str
    paths: set[Path]
    offset: int
    on_durable: Callable[[int], None]


class SimSyncer:
    """``FileSyncer`` without its thread: a requested flush becomes a job the world runs at a
    step of its choosing (or loses, if the actor dies first)."""

    def __init__(self, world: World, actor: str, on_durable: Callable[[int], None], *,
                 on_failure: Callable[[str], None] | None = None) -> None:
        self.world = world
        self.actor = actor
        self.on_durable = on_durable
        self.dirty: set[Path] = set()

    def mark(self, path: Path) -> None:
        self.dirty.add(path)

    def request(self, durable_offset: int) -> None:
        self.world.jobs.append(SyncJob(self.actor, self.dirty, durable_offset, self.on_durable))
        self.dirty = set()

    def flush_now(self, durable_offset: int) -> None:
        self.request(durable_offset)
        for job in [job for job in self.world.jobs if job.actor == self.actor]:
            self.world.run_job(job)

    def sync_here(self, durable_offset: int) -> bool:
        """The writer's sync in its loop: made at once, in the step that asked for it, when the
        actor has no flush of its thread pending; the world draws, half the time, a thread still
        busy (False: a job as ``request`` makes), so both ways are run."""
        if any(job.actor == self.actor for job in self.world.jobs) or self.world.rng.random() < 0.5:
            return False
        self.request(durable_offset)
        self.world.run_job(self.world.jobs[-1], in_loop=True)
        return True

    def close(self) -> None:
        pass


class SimWaker(Waker):
    """``Waker`` without the eventfd: the world calls the actor's ``on_thread_wake`` after the step that woke it."""

    def __init__(self, world: World, actor: str) -> None:
        super().__init__()
        self.world = world
        self.actor = actor

    def wake(self) -> None:
        self.world.wakes.add(self.actor)


def sim_config(flush_mode: str) -> StoreConfig:
    """Small files, so that a short run rolls segments, queue files and index files."""
    return StoreConfig(
        segment_size_bytes=64 * KiB, consume_queue_file_units=64, index_hash_slot_count=64, index_item_count_max=128,
        message_body_bytes_max=8 * KiB, properties_bytes_max=4 * KiB, send_batch_bytes_max=32 * KiB,
        client_frame_bytes_max=128 * KiB, flush_mode=flush_mode,  # type: ignore[arg-type]
        flush_interval_ms=50, flush_consume_queue_interval_ms=100, checkpoint_interval_ms=150,
        flush_thorough_interval_ms=400, sync_flush_timeout_ms=60_000, send_queue_wait_ms_max=200,
        consume_queue_owner_count=2, topic_queue_count_default=2, fifo_groups=(FIFO_GROUP,),
        timer_max_delay_ms=60_000, timer_wheel_slots=120, timer_log_segment_bytes=52 * 64,
        # No monitor: it serves HTTP from its own threads, outside the simulated network, reads
        # only what the others report, and writes nothing the invariants look at.
        metrics_endpoint="",
    ).validate()


@dataclass
class Counts:
    steps: int = 0
    deliveries: int = 0
    kills: int = 0
    power_cuts: int = 0
    clean_stops: int = 0
    supervisor_deaths: int = 0
    restarts: int = 0
    sync_jobs: int = 0
    trace: list[str] = field(default_factory=list)


class World:
    """One engine. A replica is a second world beside its master's (``prefix="replica/"``), on
    the same network, clock and step counts: its actors' names carry the prefix."""

    def __init__(self, root: Path, rng: random.Random, config: StoreConfig, *, publication_loss_ratio: float,
                 page_written_back_ratio: float = 1 / 3, beside: World | None = None, prefix: str = "") -> None:
        self.rng = rng
        self.config = config
        self.page_written_back_ratio = page_written_back_ratio
        self.prefix = prefix
        self.store_dir = root / f"{prefix.strip('/') or 'store'}"
        self.run_dir = root / f"{prefix.strip('/')}-run" if prefix else root / "run"
        self.store_dir.mkdir(parents=True)
        self.run_dir.mkdir(parents=True)
        self.clock: SimClock = beside.clock if beside else SimClock(1_790_000_000_000)
        self.disk = SimDisk(self.store_dir)
        self.network: Network = beside.network if beside else Network(rng,
                                                                       publication_loss_ratio=publication_loss_ratio)
        self.slots = SharedOffsets(self.run_dir)
        self.specs = {prefix + spec.name: spec for spec in actor_specs(config)}
        self.actors: dict[str, Actor] = {}
        self.next_tick: dict[str, int] = {}
        self.down: dict[str, int] = {}  # killed actor -> step it died at
        self.process_ids = itertools.count(100)  # each start a new "pid", the same in every replay
        self.jobs: list[SyncJob] = []
        self.wakes: set[str] = set()  # actors whose own thread woke them (``Actor.on_thread_wake``)
        self.counts: Counts = beside.counts if beside else Counts()
        self.on_kill: Callable[[str], None] = lambda name: None  # the client hears of every death
        self.coordination: Coordination | None = None  # an engine elected on the model of etcd (``broker_set.py``)
        self.supervisor = SimSupervisor(self, config)  # production's decisions (``supervision.py``)

    # -- actors --------------------------------------------------------------------------------

    def start(self, name: str) -> None:
        spec: ActorSpec = self.specs[name]
        module = importlib.import_module(spec.module)
        actor_cls = next(v for v in vars(module).values()
                         if isinstance(v, type) and issubclass(v, Actor) and v is not Actor)
        env = Env(spec.name, spec.instance, self.store_dir, self.run_dir, self.config, self.slots, self.clock,
                  syncer=lambda actor, on_durable, on_failure=None: SimSyncer(self, self.prefix + actor, on_durable),
                  waker=SimWaker(self, name), background=False, process_id=next(self.process_ids),
                  coordination=self.coordination)
        actor = actor_cls(env)
        out = Effects()
        actor.lifecycle = actor_step(actor.lifecycle, Lifecycle.RECOVERING)
        actor.recover(out)
        direct = actor.direct_channel()
        ports = actor.ports() if direct is None else [*actor.ports(),
                                                      Port(direct, bind=True, address=self.direct_endpoint(spec.name))]
        self.network.attach(name, ports)
        actor.lifecycle = actor_step(actor.lifecycle, Lifecycle.RUNNING)
        self.actors[name] = actor
        if self.down.pop(name, None) is not None:
            self.counts.restarts += 1
        self.next_tick[name] = self.clock.mono_ms()
        self.tell_connections(name, up=True)
        self.carry_out(name, out)
        self.deliver_wakes()  # a wake during its recovery (the writer's sync of its recovered tail)

    def direct_endpoint(self, actor: str) -> str:
        """Where ``actor`` answers clients directly (``direct_replies.bind`` on the simulated network):
        the endpoint of its last run, else a port the system gives; published for the front's ``route``."""
        *kept, anywhere = direct_replies.bind_addresses(self.config.endpoint, self.run_dir, actor)
        endpoint = kept[0] if kept else anywhere.replace(":*", f":{next(self.network.tcp_ports)}")
        direct_replies.publish(self.run_dir, actor, endpoint)
        return endpoint

    def start_all(self) -> None:
        """The supervisor's first start (``supervisor/decisions.py``): wave by wave."""
        self.supervisor.start(crash_start=False)

    def kill(self, name: str) -> None:
        """SIGKILL: the process and its queues are gone; the page cache keeps what it wrote."""
        self.actors.pop(name, None)
        self.network.detach(name)
        self.jobs = [job for job in self.jobs if job.actor != name]
        self.wakes.discard(name)
        self.down[name] = self.counts.steps
        self.counts.kills += 1
        self.tell_connections(name, up=False)
        self.on_kill(name)

    def tell_connections(self, name: str, *, up: bool) -> None:
        """What ZeroMQ's monitor tells an actor (``Actor.connection``): a monitored port connected
        to an endpoint ``name`` binds reconnects when it starts and drops when it dies; a starting
        actor's own monitored ports connect to the peers that are up."""
        bound = {port.endpoint for port in self.network.ports.get(name, {}).values() if port.bind}
        for other, actor in self.actors.items():
            for port in self.network.ports[other].values():
                if not port.monitor or port.bind:
                    continue
                if other != name and port.endpoint in bound:
                    actor.connection(port.channel, up)
                elif other == name and up and self.network.bound(port.endpoint, name) is not None:
                    actor.connection(port.channel, True)

    def power_cut(self) -> None:
        for name in list(self.actors):
            self.kill(name)
        self.disk.power_cut(self.rng, self.page_written_back_ratio)
        self.counts.power_cuts += 1
        self.start_all_again(crash_start=True, power_loss=True)

    def start_all_again(self, *, crash_start: bool, power_loss: bool = False) -> None:
        """The supervisor's next start: an empty run directory, and the crash-start marker while
        every actor recovers if the last stop was not clean (its abort marker stayed), saying
        whether the power went since (a boot id of its own: ``engine/store/unclean_stop.py``)."""
        self.new_offsets()
        self.supervisor.start(crash_start=crash_start, power_loss=power_loss)

    def new_offsets(self) -> None:
        """The supervisor starts on an empty run directory: a new shared offsets file, every slot 0
        (a reader that mapped the last one finds it replaced, as ``LocalReads`` does)."""
        SharedOffsets.mark_run_over(self.run_dir)
        self.slots.close()
        (self.run_dir / OFFSETS_FILE).unlink()
        self.slots = SharedOffsets(self.run_dir)

    def drained_at_stop(self, name: str) -> list[Channel]:
        """The channels the runtime empties at a stop: ``drain_at_stop``, and the direct channel of an
        actor that takes requests on it (the writer's sends)."""
        actor = self.actors[name]
        direct = actor.direct_channel()
        if direct is None or not actor.takes_direct_requests():
            return list(actor.drain_at_stop)
        return [*actor.drain_at_stop, direct]

    def stop(self, name: str) -> None:
        """SIGTERM: the actor handles what is queued on its ``drain_at_stop`` ports, then its
        ``shutdown`` leaves its files consistent, its flush thread finishes what it was given
        (``FileSyncer.close``), and the process exits with its queues."""
        actor = self.actors[name]
        actor.lifecycle = actor_step(actor.lifecycle, Lifecycle.STOPPING)
        out = Effects()
        for channel in self.drained_at_stop(name):
            port = self.network.ports[name][channel.name]
            for key in [key for key in self.network.busy() if key[:2] == (name, channel.name)]:
                for frames in self.network.take(key, len(self.network.queues.get(key, ()))):
                    actor.take(port, frames, out)
                    self.counts.deliveries += 1
                    self.carry_out(name, out)
                    if name not in self.actors:
                        return  # it exited (an Exit effect): killed, not stopped
            actor.drained(channel, out)
            self.carry_out(name, out)
            if name not in self.actors:
                return
        actor.shutdown(out)
        self.carry_out(name, out)
        for job in [job for job in self.jobs if job.actor == name]:
            self.run_job(job)
        actor.lifecycle = actor_step(actor.lifecycle, Lifecycle.STOPPED)
        self.actors.pop(name)
        self.network.detach(name)
        self.tell_connections(name, up=False)
        self.on_kill(name)  # to its peers and the client, a stop looks like a death

    def stop_all(self) -> bool:
        """The supervisor's stop: wave by wave in reverse start order, the actors of one wave in
        any order, while the actors of earlier waves keep working. True if the stop was clean:
        no actor was down, and the dispatcher had caught up with the log (the abort marker goes)."""
        clean = not self.down
        self.supervisor.stop()
        self.counts.clean_stops += 1
        return clean and self.slots.get(DISPATCHED) >= self.slots.get(CONFIRMED)

    def start_after_stop(self, *, clean: bool, power_off: bool) -> None:
        if power_off:
            self.disk.power_cut(self.rng, self.page_written_back_ratio)
        self.start_all_again(crash_start=not clean, power_loss=power_off)

    def supervisor_death(self) -> None:
        """The supervisor is SIGKILLed: every actor gets SIGTERM (PR_SET_PDEATHSIG) and stops on
        its own, in any order. Its loop ends, the ports of ``drain_at_stop`` are emptied, and
        ``shutdown`` leaves its files consistent (the timer and the transaction actor write their
        checkpoints), while the others still run; the page cache keeps everything. The engine
        then starts again, as after an unclean stop, on a new run directory."""
        for name in self.rng.sample(sorted(self.actors), len(self.actors)):
            actor, out = self.actors[name], Effects()
            actor.lifecycle = actor_step(actor.lifecycle, Lifecycle.STOPPING)
            for channel in self.drained_at_stop(name):
                port = self.network.ports[name][channel.name]
                for key in [key for key in self.network.busy() if key[:2] == (name, channel.name)]:
                    for frames in self.network.take(key, len(self.network.queues[key])):
                        actor.take(port, frames, out)
                actor.drained(channel, out)
            actor.shutdown(out)
            self.carry_out(name, out)
            self.trace(f"{name} stops (the supervisor died)")
            self.kill(name)
        self.new_offsets()
        self.counts.supervisor_deaths += 1
        self.supervisor.start(crash_start=True)

    def carry_out(self, name: str, out: Effects, *, may_die: bool = False) -> None:
        """Carry out an actor's effects in order; with ``may_die``, it may be killed part way."""
        cut = self.rng.randrange(len(out) + 1) if may_die and out else None
        for i, effect in enumerate(out):
            if i == cut:
                self.trace(f"kill {name} after {i} of {len(out)} effects")
                self.kill(name)
                return
            if isinstance(effect, Exit):
                self.trace(f"{name} exits: {effect.reason}")
                self.kill(name)
                return
            if isinstance(effect, Tell):
                if not self.network.carry(name, effect):
                    refusal = effect.refused()
                    if refusal is not None:
                        self.network.carry(name, refusal)
            else:
                self.network.carry(name, effect)
        out.clear()

    def run_job(self, job: SyncJob, *, in_loop: bool = False) -> None:
        """``in_loop``: the actor's own loop made the sync (``SimSyncer.sync_here``), inside its step:
        the wake-ups of other threads wait for the step's end."""
        self.jobs.remove(job)
        for path in sorted(job.paths):
            self.disk.on_sync(path, 0, None)
        job.on_durable(job.offset)
        self.counts.sync_jobs += 1
        if not in_loop:
            self.deliver_wakes()

    def deliver_wakes(self) -> None:
        """``on_thread_wake`` for each running actor one of its threads woke (a recovering one's waits)."""
        for name in sorted(self.wakes & self.actors.keys()):
            self.wakes.discard(name)
            out = Effects()
            self.actors[name].on_thread_wake(out)
            self.carry_out(name, out)

    def trace(self, line: str) -> None:
        self.counts.trace.append(f"{self.counts.steps:5d} {line}")

    # -- steps ---------------------------------------------------------------------------------

    def deliver(self, may_die: bool) -> bool:
        busy = [key for key in self.network.busy() if key[0] in self.actors]
        if not busy:
            return False
        key = busy[self.rng.randrange(len(busy))]
        receiver, port_name, _sender = key
        actor = self.actors[receiver]
        port = self.network.ports[receiver][port_name]
        out = Effects()
        for frames in self.network.take(key, self.rng.randint(1, DELIVERIES_PER_STEP_MAX)):
            actor.take(port, frames, out)
            self.counts.deliveries += 1
        actor.drained(port.channel, out)
        self.carry_out(receiver, out, may_die=may_die and self.rng.random() < 0.05)
        return True

    def tick_one(self) -> None:
        """Move time to the next due tick (and up to 20 ms more) and run it."""
        name = min(self.actors, key=lambda n: (self.next_tick[n], self.rng.random()))
        due = self.next_tick[name]
        if due > self.clock.mono_ms():
            self.clock.advance(due - self.clock.mono_ms())
        self.clock.advance(self.rng.randrange(0, 20))
        actor = self.actors[name]
        out = Effects()
        actor.tick(out)
        self.next_tick[name] = self.clock.mono_ms() + actor.tick_interval_ms
        self.carry_out(name, out)

    def backlog_one(self) -> bool:
        busy = [name for name, actor in self.actors.items() if actor.backlog()]
        if not busy:
            return False
        name = busy[self.rng.randrange(len(busy))]
        out = Effects()
        self.actors[name].work_backlog(out)
        self.carry_out(name, out)
        return True

    def job_one(self) -> bool:
        """Run the oldest pending flush of one actor: each actor's flushes run in order, as its
        ``FileSyncer`` thread runs them; different actors' flushes interleave in any order."""
        if not self.jobs:
            return False
        actor = self.rng.choice(sorted({job.actor for job in self.jobs}))
        self.run_job(next(job for job in self.jobs if job.actor == actor))
        return True

    def settle(self, steps_max: int = 5_000) -> bool:
        """Run without faults or new requests until nothing is left to do; False if it never ends."""
        for name in list(self.down):
            self.start(name)
        for _ in range(steps_max):
            if self.deliver(may_die=False) or self.backlog_one() or self.job_one():
                continue
            if self.quiet():
                return True
            self.tick_one()
        return False

    def pass_time(self, ms: int, steps_max: int = 20_000) -> None:
        """Run without faults or new requests until ``ms`` of simulated time have passed."""
        for name in list(self.down):
            self.start(name)
        until = self.clock.mono_ms() + ms
        for _ in range(steps_max):
            if self.clock.mono_ms() >= until:
                return
            if not (self.deliver(may_die=False) or self.backlog_one() or self.job_one()):
                self.tick_one()

    def quiet(self) -> bool:
        """Every receiver applied and flushed the log up to its end, and the checkpoint says so."""
        end = self.slots.get(CONFIRMED)
        owners = range(self.config.consume_queue_owner_count)
        progress = [self.slots.get(owner_slot(k)) for k in owners] + [self.slots.get(INDEX_APPLIED)]
        durables = [self.slots.get(owner_durable_slot(k)) for k in owners] + [self.slots.get(INDEX_DURABLE)]
        checkpoint = load_checkpoint(self.store_dir)
        dispatched, flushed = (checkpoint.dispatched_offset, checkpoint.flushed_offset) if checkpoint else (0, 0)
        return (self.slots.get(FLUSHED) == end and all(p == end for p in progress) and all(d == end for d in durables)
                and dispatched == end and flushed == end)


def scratch_dir() -> str | None:
    """Where a run's store goes: tmpfs if the host has one (the files are real, the disk simulated)."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None


@contextlib.contextmanager
def leftover_descriptors_closed() -> Iterator[None]:
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
