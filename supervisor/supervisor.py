"""The supervisor: starts every actor, watches them, restarts the ones that die.

It is a reconcile loop: each turn it reads heartbeats and control requests, reaps exited actors,
restarts them with backoff (their own ``recover()`` repairs what the crash left), kills actors
whose heartbeats stopped, and publishes what happened as events (PUB ``events.sock``) that tests
and tools wait on. What a start, a change of role and a stop do is decided by ``decisions.py``;
this module carries the decisions out with processes (``processes.py``) and files
(``store_effects.py``).

Store-level duties (RocketMQ's DefaultMessageStore start/shutdown):

* ``lock``: an exclusive ``flock`` for the engine's lifetime; the actors inherit the descriptor,
  so the store stays locked until the last one exits;
* ``abort``: created at start, removed only after a clean stop in which every actor exited
  normally and the reput dispatcher had caught up with the log.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import shutil
import time
from pathlib import Path

import zmq

from engine.actors.specs import MEMBERSHIP
from engine.config import StoreConfig, encode_config
from engine.coordination.role import Role
from engine.ipc import endpoints
from engine.ipc.lifecycle import Lifecycle, supervised_step
from engine.ipc.messages import (
    ActorStatus,
    ControlReply,
    ControlRequest,
    Event,
    KillCommand,
    RoleChanged,
    StatusQuery,
    StopCommand,
    control_request_decoder,
    encoder,
    heartbeat_decoder,
)
from engine.logs import LOG_DIR, configure_logging, event
from engine.offline.truncate import ABORT_MARKER
from engine.store.atomic_file import write_atomically
from engine.store.shared_offsets import CONFIRMED, DISPATCHED, RUN_OVER, SharedOffsets
from engine.store.unclean_stop import abort_note, power_loss_possible
from supervisor import store_effects
from supervisor.decisions import (
    Decisions,
    DropStandby,
    Effect,
    ForkCheck,
    KeepSpare,
    KeepStandby,
    Kill,
    Publish,
    Spawn,
    StartWave,
    StopWave,
    WriteSettings,
)
from supervisor.processes import (
    ActorProcess,
    Spawner,
    Standby,
    kill_and_reap,
    monotonic_ms,
    release,
    resources,
    signal_stop,
    start_failure,
    take_over,
    wait_stopped,
)
from supervisor.start_checks import EngineError, check_file_systems, lock_and_check
from supervisor.wakeup import drain, signal_wakeup
from supervisor.watch import Watch

log = logging.getLogger("supervisor")

_STACK_DUMP_GRACE_MS = 300
ABORT_FILE = ABORT_MARKER
FAULTS_FILE = "supervisor.faults"  # in logs/: the stacks of a supervisor ended by a fatal signal


class Supervisor:
    def __init__(self, store_dir: Path, config: StoreConfig, *, parent_pid: int | None = None,
                 log_stderr: bool = True) -> None:
        self.store_dir = store_dir.resolve()
        self.config = config
        self.log_stderr = log_stderr  # log lines go to logs/supervisor.log, and to stderr too unless detached
        self.parent_pid = parent_pid  # --die-with-parent: stop when our parent is no longer this process
        self.decisions = Decisions(config)
        self.actors: dict[str, ActorProcess] = {}  # spawned ones (``carry_out``)
        self.retiring: dict[str, ActorProcess] = {}  # replaced by a new role's, until they are killed
        self.warm = 0  # standby processes a change of role took
        self.clean = True  # every actor stopped without a fault (``shutdown``)
        self.stopping = False
        self.zctx = zmq.Context()

    # -- start -------------------------------------------------------------

    def start(self) -> None:
        """Check, lock, then start every actor wave by wave. A start that fails its checks (the
        store held by another engine, a port in use, a store directory it cannot write) leaves the
        store as it was: no abort marker, no new file (at most the lock and logs/)."""
        self.lock_fd = lock_and_check(self.store_dir, self.config)
        configure_logging("supervisor", self.store_dir / LOG_DIR, self.config, stderr=self.log_stderr)
        # A fatal signal (SIGSEGV, SIGABRT, SIGBUS...) leaves the supervisor's stacks in the store's logs.
        self.faults = (self.store_dir / LOG_DIR / FAULTS_FILE).open("a", encoding="utf-8")
        faulthandler.enable(self.faults, all_threads=True)
        started_ms = monotonic_ms()
        try:
            check_file_systems(self.store_dir)
        except EngineError as exc:
            log.error("not starting: %s", exc)
            raise
        abort = self.store_dir / ABORT_FILE
        crash_start = abort.exists()
        power_loss = crash_start and power_loss_possible(abort.read_text(errors="replace"))
        if crash_start:
            log.warning("the previous run did not stop cleanly (abort marker present%s); recovering",
                        ", from another boot: the log's tail is swept as after a power cut" if power_loss else "",
                        extra=event("engine.recovering", power_loss=power_loss))
        write_atomically(abort, abort_note().encode())  # durable: a power cut must not take it
        self.run_dir = store_effects.fresh_run_dir(self.store_dir)
        self.offsets = SharedOffsets(self.run_dir)
        self.config_path = self.run_dir / "config.json"
        self.config_path.write_bytes(encode_config(self.config))
        self.spawner = Spawner(self.store_dir, self.run_dir, self.config, self.config_path, self.lock_fd)
        self.watch = Watch(self.actors, self.config, self._restart, self.publish)
        self.standby, self.spares = (Standby(lambda actor: self.spawner.spawn(actor, gated=True),
                                             self.config.actor_stop_timeout_ms) for _ in range(2))
        self.control = self._bind(zmq.ROUTER, endpoints.SUPERVISOR_CONTROL)
        self.events = self._bind(zmq.PUB, endpoints.SUPERVISOR_EVENTS)
        self.heartbeats = self._bind(zmq.PULL, endpoints.SUPERVISOR_HEARTBEATS)
        state = {"pid": os.getpid(), "endpoint": self.config.endpoint, "store_dir": str(self.store_dir),
                 **endpoints.namespaces()}
        (self.run_dir / endpoints.ENGINE_STATE_FILE).write_text(json.dumps(state))
        self.carry_out(self.decisions.start(crash_start=crash_start, power_loss=power_loss))
        if self.config.elected:  # the others start in the role the membership actor takes
            self.carry_out(self.decisions.role_changed(self._await_role()))
        took_ms = monotonic_ms() - started_ms
        reasons = self.watch.reasons()
        log.log(logging.WARNING if reasons else logging.INFO, "engine ready on %s in %d ms (%d actors)%s",
                self.config.endpoint, took_ms, len(self.actors), degraded_note(reasons),
                extra=event("engine.ready", endpoint=self.config.endpoint, duration_ms=took_ms,
                            state="DEGRADED" if reasons else "RUNNING"))
        self.publish("engine.ready")
        self.carry_out(self.decisions.ready())  # after the start: their imports do not delay it

    def carry_out(self, effects: list[Effect]) -> None:
        """Do what ``decisions`` decided, in order."""
        for effect in effects:
            if store_effects.carry_out(effect, self.store_dir, self.run_dir, self.offsets):
                continue
            match effect:
                case WriteSettings(config=config):
                    self.config_path.write_bytes(encode_config(config))
                    role = self.decisions.role
                    if role is not None:
                        log.info("role: %s of epoch %d (master: broker %d)", role.role, role.epoch, role.master_id,
                                 extra=event("role.entered", role=role.role, epoch=role.epoch))
                case Spawn(name=name, standby_ok=standby_ok):
                    spec = self.decisions.specs[name]
                    if (old := self.actors.get(name)) is not None:
                        self.retiring[name] = old
                    warm = (self.standby.take(spec) or self.spares.take(spec)) if standby_ok else None
                    actor = self.actors[name] = warm or ActorProcess(spec)
                    if warm is None:
                        self.spawner.spawn(actor, gated=True)
                        log.info("actor %s started (pid %d)", name, actor.pid,
                                 extra=event("actor.started", actor_name=name, actor_pid=actor.pid))
                        self.publish("actor.started", actor)
                    self.warm += warm is not None
                case StartWave(names=names):
                    for name in names:
                        release(self.actors[name])
                    for name in names:
                        self._await_running(self.actors[name])
                case Kill(names=names):
                    self._kill([self.retiring.pop(name) if name in self.retiring else self.actors.pop(name)
                                for name in names if name in self.retiring or name in self.actors])
                case StopWave(names=names):
                    stopping = [self.actors[name] for name in names if name in self.actors]
                    for actor in stopping:  # an actor's stop waits for nothing of another in its wave
                        signal_stop(actor)
                    stopped = [self._stop_actor(actor) for actor in stopping]  # each waited for
                    self.clean &= all(stopped)
                case KeepStandby(names=names):
                    master_specs = Decisions(self.config.replace(replica_of="")).specs
                    self.standby.keep([master_specs[name] for name in names])
                case KeepSpare(names=names):
                    self.spares.keep_only([self.decisions.specs[name] for name in names])
                case DropStandby():
                    self.standby.drop()
                case ForkCheck(role=role, forked=forked, kept=kept):
                    forks = store_effects.forks(self.store_dir, self.run_dir, role)
                    if not forks:
                        log.info("follows the master of epoch %d with its actors kept: its log is a prefix of the "
                                 "master's", role.epoch, extra=event("role.follow_kept", epoch=role.epoch))
                    self.carry_out(list(forked if forks else kept))
                case Publish(kind=kind):
                    self.publish(kind)

    def _kill(self, actors: list[ActorProcess]) -> None:
        for actor, code in kill_and_reap(actors):
            self.publish("actor.exited", actor, exit_code=code)
            actor.process = None

    def _change_role(self, role: Role) -> None:
        """The membership actor holds another role: the new role's actors are spawned (or taken from
        the standby ones), every other is killed, and the new ones let through (``decisions.py``)."""
        if role == self.decisions.role:
            return
        started_ms, self.warm = monotonic_ms(), 0
        effects = self.decisions.role_changed(role)
        self.carry_out(effects)
        coming = sum(isinstance(effect, Spawn) for effect in effects)
        if coming:
            log.warning("now %s of epoch %d (actors started again in %d ms, %d of %d waiting ready)", role.role,
                        role.epoch, monotonic_ms() - started_ms, self.warm, coming,
                        extra=event("role.changed", role=role.role, epoch=role.epoch))

    def _restart(self, actor: ActorProcess) -> None:
        """A dead actor's next process: its spare, let through, if one waits (then a new spare)."""
        spare = self.spares.take(actor.spec)
        if spare is None:
            self.spawner.spawn(actor, gated=False)
            return
        take_over(actor, spare)
        self.spares.keep([actor.spec])

    def _bind(self, kind: int, name: str) -> zmq.Socket[bytes]:
        sock = endpoints.configure(self.zctx.socket(kind), hwm=self.config.socket_hwm_messages)
        sock.bind(endpoints.ipc(self.run_dir, name))
        return sock

    def _await_role(self) -> Role:
        """The start of an engine elected on etcd: the first role its membership actor tells."""
        membership = self.actors[MEMBERSHIP]
        deadline = monotonic_ms() + self.config.actor_start_timeout_ms
        while monotonic_ms() < deadline:
            if membership.process is not None and membership.process.poll() is not None:
                failure = start_failure(membership, self.store_dir)
                self.shutdown()
                raise EngineError(failure)
            if self.heartbeats.poll(20):
                self._drain_heartbeats()
            if self.control.poll(0):
                identity, raw = self.control.recv_multipart()
                request = control_request_decoder.decode(raw)
                reply = ControlReply(ok=isinstance(request, RoleChanged), message="the engine is starting")
                self.control.send_multipart([identity, encoder.encode(reply)])
                if isinstance(request, RoleChanged):
                    return Role.of(request)
        self.shutdown()
        raise EngineError(f"the broker membership actor took no role within {self.config.actor_start_timeout_ms} "
                          f"ms: {membership.condition or 'etcd did not answer'}")

    def _await_running(self, actor: ActorProcess) -> None:
        deadline = monotonic_ms() + self.config.actor_start_timeout_ms
        while actor.lifecycle != "RUNNING":
            if actor.process is not None and actor.process.poll() is not None:
                failure = start_failure(actor, self.store_dir)  # before the shutdown lets the process go
                self.shutdown()
                raise EngineError(failure)
            if monotonic_ms() > deadline:
                self.shutdown()
                raise EngineError(f"actor {actor.spec.name} did not start within "
                                  f"{self.config.actor_start_timeout_ms} ms")
            if self.heartbeats.poll(100):
                self._drain_heartbeats()

    # -- run ---------------------------------------------------------------

    def request_stop(self) -> None:
        self.stopping = True

    def run(self) -> None:
        """The reconcile loop, until a stop is requested."""
        poller = zmq.Poller()
        poller.register(self.control, zmq.POLLIN)
        poller.register(self.heartbeats, zmq.POLLIN)
        with signal_wakeup() as wakeup:
            if wakeup is not None:  # a signal (Ctrl-C) ends the poll; pyzmq would resume it, up to 100 ms
                poller.register(wakeup, zmq.POLLIN)
            while not self.stopping:
                ready = dict(poller.poll(100))
                if wakeup is not None and wakeup in ready:
                    drain(wakeup)
                if self.heartbeats in ready:
                    self._drain_heartbeats()
                if self.control in ready:
                    self._drain_control()
                self.watch.reconcile(monotonic_ms())
                if self.parent_pid is not None and not self.stopping and os.getppid() != self.parent_pid:
                    log.error("the process that started the engine (pid %d) is gone; stopping", self.parent_pid)
                    self.request_stop()

    def _drain_heartbeats(self) -> None:
        for _ in range(1000):
            try:
                self.watch.heartbeat(heartbeat_decoder.decode(self.heartbeats.recv(zmq.NOBLOCK)))
            except zmq.Again:
                return

    def _drain_control(self) -> None:
        for _ in range(100):
            try:
                identity, raw = self.control.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except ValueError:
                continue
            try:
                request = control_request_decoder.decode(raw)
            except Exception as exc:
                reply = ControlReply(ok=False, message=f"bad control request: {exc}")
            else:
                reply = self.control_command(request)
            self.control.send_multipart([identity, encoder.encode(reply)])

    def control_command(self, request: ControlRequest) -> ControlReply:
        match request:
            case StatusQuery():
                return self.status()
            case StopCommand():
                self.request_stop()
                return ControlReply(ok=True, message="stopping")
            case RoleChanged():
                self._change_role(Role.of(request))
                return ControlReply(ok=True, message="role taken")
            case KillCommand(name=name):
                actor = self.actors.get(name)
                if actor is None or actor.process is None:
                    return ControlReply(ok=False, message=f"no actor named {name!r}")
                actor.process.kill()
                return ControlReply(ok=True, message=f"killed {name} (pid {actor.pid})")

    def status(self) -> ControlReply:
        actors = [ActorStatus(a.spec.name, a.pid, Lifecycle.GAVE_UP if a.gave_up else a.lifecycle, a.restarts,
                              {**a.detail, **resources(a.pid)}, a.condition)
                  for a in self.actors.values()]
        reasons = self.watch.reasons()
        return ControlReply(ok=True, state="DEGRADED" if reasons else "RUNNING", endpoint=self.config.endpoint,
                            actors=actors, offsets=self.offsets.snapshot(self.config.consume_queue_owner_count),
                            reasons=reasons)

    def publish(self, kind: str, actor: ActorProcess | None = None, *, exit_code: int = 0) -> None:
        event = Event(kind, actor.spec.name if actor else "", actor.pid if actor else 0, exit_code,
                      time.time_ns() // 1_000_000)
        self.events.send_multipart([endpoints.TOPIC_EVENT, encoder.encode(event)])

    # -- stop --------------------------------------------------------------

    def shutdown(self) -> bool:
        """Stop every actor in reverse start order; True if the stop was clean."""
        log.info("engine stopping", extra=event("engine.stopping"))
        self.publish("engine.stopping")
        self.clean = True
        self.carry_out(self.decisions.stop())
        caught_up = self.offsets.get(DISPATCHED) >= self.offsets.get(CONFIRMED)
        if self.clean and caught_up:
            (self.store_dir / ABORT_FILE).unlink(missing_ok=True)
            log.info("engine stopped cleanly", extra=event("engine.stopped", clean=True))
        else:
            log.warning("stopped abnormally (clean=%s, dispatcher caught up=%s); keeping the abort marker",
                        self.clean, caught_up, extra=event("engine.stopped", clean=False))
        self.publish("engine.stopped")
        for sock in (self.control, self.events, self.heartbeats):
            sock.close()
        self.zctx.term()
        self.offsets.set(RUN_OVER, 1)  # a reader on the host (LocalReads) lets this run's offsets go
        self.offsets.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        os.close(self.lock_fd)
        return self.clean and caught_up

    def _stop_actor(self, actor: ActorProcess) -> bool:
        """Wait for the signalled actor to stop; True if it stopped cleanly."""
        if actor.process is None:
            return actor.restart_at_ms is None and not actor.gave_up
        code = wait_stopped(actor, self.config.actor_stop_timeout_ms)
        self._drain_heartbeats()
        self.publish("actor.exited", actor, exit_code=code)
        actor.process = None
        actor.lifecycle = supervised_step(actor.lifecycle, Lifecycle.STOPPED)
        return code == 0 or actor.held  # one still held at its gate wrote nothing, whatever ended it


def degraded_note(reasons: list[str]) -> str:
    """What follows "ready ..." on a DEGRADED start: " DEGRADED: writer: ...; ..." ("" when RUNNING)."""
    return f" DEGRADED: {'; '.join(reasons)}" if reasons else ""
