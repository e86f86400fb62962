"""The supervisor: starts every actor, watches them, restarts the ones that die.

It is a reconcile loop: each turn it reads heartbeats and control requests,
reaps exited actors, restarts them with backoff (their own ``recover()``
repairs what the crash left), kills actors whose heartbeats stopped, and
publishes what happened as events (PUB ``events.sock``) that tests and tools
wait on.

Store-level duties (RocketMQ's DefaultMessageStore start/shutdown):

* ``lock``: an exclusive ``flock`` for the engine's lifetime; the actors
  inherit the descriptor, so the store stays locked until the last one exits;
* ``abort``: created at start, removed only after a clean stop in which every
  actor exited normally and the reput dispatcher had caught up with the log.
"""

from __future__ import annotations

import contextlib
import faulthandler
import fcntl
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import zmq

from engine.actors.specs import MEMBERSHIP, ActorSpec, actor_specs
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
from engine.offline import truncate
from engine.offline.truncate import ABORT_MARKER
from engine.store.shared_mapping_check import SharedMappingError, check_shared_mappings
from engine.store.shared_offsets import (
    CONFIRMED,
    DISPATCHED,
    EPOCH,
    IN_SYNC_PUBLISHED,
    LEASE_DEADLINE,
    RUN_OVER,
    SLOT_COUNT,
    SharedOffsets,
)
from supervisor.start_checks import (
    LOCK_FILE,
    EngineError,
    check_ports,
    check_store_free,
    check_store_writable,
    held_error,
    last_line,
)

log = logging.getLogger("supervisor")

_STACK_DUMP_GRACE_MS = 300
ABORT_FILE = ABORT_MARKER
FAULTS_FILE = "supervisor.faults"  # in logs/: the stacks of a supervisor ended by a fatal signal


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass
class ActorProcess:
    spec: ActorSpec
    process: subprocess.Popen[bytes] | None = None
    lifecycle: Lifecycle = Lifecycle.DOWN
    last_heartbeat_ms: int = 0
    detail: dict[str, int] = field(default_factory=dict)
    condition: str = ""  # why it cannot do its work though running (its heartbeat's); "" when it can
    restarts: int = 0
    restart_times: deque[int] = field(default_factory=deque)
    restart_at_ms: int | None = None
    spawned_at_ms: int = 0  # spawned, or let through its start gate: for the recovery time in the log
    start_gate: int | None = None  # the write end of the pipe it waits on before recovering (``_release``)
    held: bool = False  # spawned at the start and not yet let through its gate: it has not touched the store
    stderr_offset: int = 0  # where this run's raw stderr begins in <name>.stderr
    kill_at_ms: int | None = None  # a hung actor dumps its stacks, then is killed at this time
    gave_up: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0


def _resources(pid: int) -> dict[str, int]:
    """Memory and descriptors of a live actor (psutil), for ``status``; empty if it is gone."""
    if not pid:
        return {}
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            memory = process.memory_info()
            return {"rss_bytes": memory.rss, "private_bytes": memory.rss - memory.shared,
                    "open_files": process.num_fds()}
    except psutil.Error:
        return {}


class Supervisor:
    def __init__(self, store_dir: Path, config: StoreConfig, *, parent_pid: int | None = None,
                 log_stderr: bool = True) -> None:
        self.store_dir = store_dir.resolve()
        self.config = config
        self.log_stderr = log_stderr  # log lines go to logs/supervisor.log, and to stderr too unless detached
        self.parent_pid = parent_pid  # --die-with-parent: stop when our parent is no longer this process
        self.actors = {spec.name: ActorProcess(spec) for spec in actor_specs(config)}
        self.role: Role | None = None  # elected on etcd: the role the actors run in (``_enter_role``)
        # A replica elected on etcd keeps a master's actors spawned and waiting at their start gates
        # (``standby_master_actors``), so that its promotion does not wait for their interpreters.
        self.standby: dict[str, ActorProcess] = {}
        self.role_config = config
        self.stopping = False
        self.crash_start = False
        self.zctx = zmq.Context()

    # -- start -------------------------------------------------------------

    def start(self) -> None:
        """Check, lock, then start every actor wave by wave.

        A start that fails its checks (the store held by another engine, a
        port in use, a store directory it cannot write) leaves the store as
        it was: no abort marker, no new file (a store directory it cannot write
        leaves at most the lock and logs/).
        """
        check_store_free(self.store_dir)  # these two create nothing: a refused start leaves no trace
        check_ports(self.config)
        try:
            self.store_dir.mkdir(parents=True, exist_ok=True)
            (self.store_dir / LOG_DIR).mkdir(exist_ok=True)
            self._lock()
        except OSError as exc:
            raise EngineError(f"cannot use the store directory {self.store_dir}: {exc.strerror or exc}") from None
        try:
            check_ports(self.config)  # again, holding the lock: an engine that started meanwhile binds them now
            check_store_writable(self.store_dir)
        except EngineError:
            os.close(self.lock_fd)
            raise
        # Only the engine holding the lock writes (and rotates) the store's logs.
        configure_logging("supervisor", self.store_dir / LOG_DIR, self.config, stderr=self.log_stderr)
        # A fatal signal (SIGSEGV, SIGABRT, SIGBUS...) leaves the supervisor's stacks in the store's
        # logs, even when its stderr is a pipe nobody reads any more (a script's, a test's).
        self.faults = (self.store_dir / LOG_DIR / FAULTS_FILE).open("a", encoding="utf-8")
        faulthandler.enable(self.faults, all_threads=True)
        started_ms = monotonic_ms()
        self._check_file_systems()
        self.crash_start = (self.store_dir / ABORT_FILE).exists()
        if self.crash_start:
            log.warning("the previous run did not stop cleanly (abort marker present); recovering",
                        extra=event("engine.recovering"))
        (self.store_dir / ABORT_FILE).write_text(str(os.getpid()))
        self.run_dir = endpoints.ensure_run_dir(self.store_dir)
        SharedOffsets.mark_run_over(self.run_dir)  # a reader of a killed engine's offsets: read afresh
        for stale in self.run_dir.iterdir():  # a killed engine's sockets and files, and its metrics/
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale)
            else:
                stale.unlink()
        self.offsets = SharedOffsets(self.run_dir)
        if self.crash_start:
            (self.run_dir / endpoints.CRASH_START_FILE).write_text(str(os.getpid()))
        self.config_path = self.run_dir / "config.json"
        self.config_path.write_bytes(encode_config(self.config))
        self.control = self._bind(zmq.ROUTER, endpoints.SUPERVISOR_CONTROL)
        self.events = self._bind(zmq.PUB, endpoints.SUPERVISOR_EVENTS)
        self.heartbeats = self._bind(zmq.PULL, endpoints.SUPERVISOR_HEARTBEATS)
        state = {"pid": os.getpid(), "endpoint": self.config.endpoint, "store_dir": str(self.store_dir)}
        (self.run_dir / endpoints.ENGINE_STATE_FILE).write_text(json.dumps(state))
        if self.config.elected:  # the broker membership actor first: it decides the role the others take
            self._start_waves([self.actors[MEMBERSHIP]])
            self._enter_role()
        self._start_waves([actor for actor in self.actors.values() if actor.process is None])
        # Every actor recovered once knowing the last stop was unclean; a later restart follows a kill.
        (self.run_dir / endpoints.CRASH_START_FILE).unlink(missing_ok=True)
        took_ms = monotonic_ms() - started_ms
        reasons = self.reasons()
        log.log(logging.WARNING if reasons else logging.INFO, "engine ready on %s in %d ms (%d actors)%s",
                self.config.endpoint, took_ms, len(self.actors), degraded_note(reasons),
                extra=event("engine.ready", endpoint=self.config.endpoint, duration_ms=took_ms,
                            state="DEGRADED" if reasons else "RUNNING"))
        self.publish("engine.ready")
        self._keep_standby()  # after the start: their imports do not delay it

    def _start_waves(self, actors: list[ActorProcess]) -> None:
        # Every process is spawned now, behind its start gate: its interpreter and imports (about
        # 0.1 s of CPU each) overlap with the earlier waves' recovery. Its recovery waits for its wave.
        for actor in actors:
            self._spawn(actor, gated=True)
        self._release_waves(actors)

    def _release_waves(self, actors: list[ActorProcess]) -> None:
        for wave in sorted({actor.spec.wave for actor in actors}):
            starting = [actor for actor in actors if actor.spec.wave == wave]
            for actor in starting:
                self._release(actor)
            for actor in starting:
                self._await_running(actor)

    # -- the role, elected on etcd ------------------------------------------

    def _enter_role(self) -> None:
        """At the start: take the role the broker membership actor wrote (``role.json``)."""
        role = Role.load(self.run_dir)
        assert role is not None, "the broker membership actor runs only once it has written the role"
        self.actors = {MEMBERSHIP: self.actors[MEMBERSHIP], **self._role_actors(role)}
        self._prepare_store(role)

    def _role_actors(self, role: Role) -> dict[str, ActorProcess]:
        """The settings of ``role`` into the run directory, and its actors (the membership actor aside)."""
        config = self.config.replace(replica_of="" if role.is_master else role.master_replication_endpoint)
        self.role, self.role_config = role, config
        self.config_path.write_bytes(encode_config(config))
        log.info("role: %s of epoch %d (master: broker %d)", role.role, role.epoch, role.master_id,
                 extra=event("role.entered", role=role.role, epoch=role.epoch))
        return {spec.name: ActorProcess(spec) for spec in actor_specs(config) if spec.name != MEMBERSHIP}

    def _prepare_store(self, role: Role) -> None:
        """With no actor but the membership one touching the store (``prepare_for_role``)."""
        point = truncate.prepare_for_role(self.store_dir, role)
        if point is not None:
            # Every actor recovers as after an unclean stop: queue units and index items past the cut go.
            (self.run_dir / endpoints.CRASH_START_FILE).write_text(str(os.getpid()))
            log.warning("the log forked from the master's of epoch %d at %d: cut there", role.epoch, point,
                        extra=event("role.log_cut", epoch=role.epoch, offset=point))

    def _change_role(self) -> None:
        """The broker membership actor changed the role: the new role's actors are spawned (held at
        their start gates: their imports overlap with the rest), every other actor is killed, the
        store prepared, and the new ones let through, recovering as after an unclean stop."""
        role = Role.load(self.run_dir)
        if role is None or role == self.role:
            return
        if role.is_master and self.role is not None and self.role.is_master:  # elected again: no actor changes
            self.role = role
            self._prepare_store(role)
            return
        started_ms = monotonic_ms()
        others = [actor for actor in self.actors.values() if actor.spec.name != MEMBERSHIP]
        coming = self._role_actors(role)
        warm = 0
        for name, actor in coming.items():
            ready = self.standby.pop(name, None)
            if ready is not None and ready.spec == actor.spec and ready.process is not None \
                    and ready.process.poll() is None:
                coming[name] = ready  # spawned while this engine was a replica: its imports are done
                warm += 1
            else:
                self._spawn(actor, gated=True)
        # Killed, not stopped in order: they recover as after a crash anyway, and an orderly stop of
        # every wave took most of a failover's time (1.7 s of 4 here).
        for actor in others:
            if actor.process is not None:
                actor.process.kill()
        for actor in others:
            if actor.process is not None:
                self.publish("actor.exited", actor, exit_code=actor.process.wait())
                actor.process = None
        # Every slot as a start finds it (the run directory's files are new then), but the membership
        # actor's: a stale one (a dispatched or durable offset past a cut) would mislead the new actors.
        for slot in range(SLOT_COUNT):
            if slot not in (EPOCH, LEASE_DEADLINE, IN_SYNC_PUBLISHED):
                self.offsets.set(slot, 0)
        self.actors = {MEMBERSHIP: self.actors[MEMBERSHIP], **coming}
        self._prepare_store(role)
        (self.run_dir / endpoints.CRASH_START_FILE).write_text(str(os.getpid()))
        self._release_waves(list(coming.values()))
        (self.run_dir / endpoints.CRASH_START_FILE).unlink(missing_ok=True)
        log.warning("now %s of epoch %d (actors started again in %d ms, %d of %d waiting ready)", role.role,
                    role.epoch, monotonic_ms() - started_ms, warm, len(coming),
                    extra=event("role.changed", role=role.role, epoch=role.epoch))
        self.publish("role.changed")
        if role.is_master:
            self._drop_standby()  # those a master does not run (a replica's following another keeps them)
        self._keep_standby()

    def _keep_standby(self) -> None:
        """On a replica elected on etcd: a master's actors spawned, held at their start gates (their
        interpreters and imports done: 1.2 s of a promotion on two cores), until a promotion lets
        them through (``_change_role``) or the engine stops. They read the settings when let through."""
        if not (self.config.elected and self.config.standby_master_actors and self.role is not None
                and not self.role.is_master):
            return
        master_config = self.config.replace(replica_of="")
        for spec in actor_specs(master_config):
            waiting = self.standby.get(spec.name)
            if spec.name != MEMBERSHIP and (waiting is None or waiting.process is None
                                            or waiting.process.poll() is not None):
                actor = self.standby[spec.name] = ActorProcess(spec)
                self._spawn(actor, gated=True, standby=True)

    def _drop_standby(self) -> None:
        """Let the waiting actors go: the pipe closed without a byte, each exits at its gate."""
        for actor in self.standby.values():
            if actor.start_gate is not None:
                os.close(actor.start_gate)
                actor.start_gate = None
        for actor in self.standby.values():
            if actor.process is not None:
                try:
                    wait_exit(actor.process, self.config.actor_stop_timeout_ms / 1000)
                except subprocess.TimeoutExpired:
                    actor.process.kill()
                    actor.process.wait()
        self.standby = {}

    def _check_file_systems(self) -> None:
        """Refuse a store (or run directory) whose files the actors could not share through mmap: a
        FUSE mount with direct_io made the first actor to map a file die with "No such device"."""
        run_dir = endpoints.ensure_run_dir(self.store_dir)
        for directory in (self.store_dir, run_dir):
            try:
                check_shared_mappings(directory)
            except SharedMappingError as exc:
                log.error("not starting: %s", exc)
                raise EngineError(str(exc)) from None

    def _lock(self) -> None:
        self.lock_fd = os.open(self.store_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.lock_fd, 32, 0).decode(errors="replace").strip()
            os.close(self.lock_fd)
            raise held_error(self.store_dir, int(holder) if holder.isdigit() else 0) from None
        os.ftruncate(self.lock_fd, 0)
        os.pwrite(self.lock_fd, str(os.getpid()).encode(), 0)

    def _bind(self, kind: int, name: str) -> zmq.Socket:
        sock = endpoints.configure(self.zctx.socket(kind), hwm=self.config.socket_hwm_messages)
        sock.bind(endpoints.ipc(self.run_dir, name))
        return sock

    def _spawn(self, actor: ActorProcess, *, gated: bool = False, standby: bool = False) -> None:
        """Start the actor's process; ``gated``: it waits, before it touches the store, until ``_release``
        (a byte on a pipe; the pipe closed without one and it exits 0, ``engine/actors/base.py``)."""
        spec = actor.spec
        # The actor logs to logs/<name>.log itself; its raw stderr (a traceback, a stack dump) goes here.
        stderr_path = self.store_dir / LOG_DIR / f"{spec.name}.stderr"
        _rotate_if_full(stderr_path, self.config.log_file_bytes_max, self.config.log_files_kept)
        log_file = open(stderr_path, "ab")  # noqa: SIM115 - handed to the child
        actor.stderr_offset = log_file.tell()
        command = [sys.executable, "-m", spec.module, "--name", spec.name, "--instance", str(spec.instance),
                   "--store-dir", str(self.store_dir), "--run-dir", str(self.run_dir),
                   "--config", str(self.config_path)]
        pass_fds = [self.lock_fd]
        if gated:
            gate_read, actor.start_gate = os.pipe()
            actor.held = True
            command += ["--start-gate-fd", str(gate_read)]
            pass_fds.append(gate_read)
        try:
            actor.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                                             pass_fds=pass_fds, start_new_session=False)
        finally:
            log_file.close()
            if gated:
                os.close(gate_read)
        actor.lifecycle = supervised_step(actor.lifecycle, Lifecycle.STARTING)
        actor.last_heartbeat_ms = actor.spawned_at_ms = monotonic_ms()
        actor.restart_at_ms = None
        if standby:  # not one of the engine's actors until a promotion lets it through
            log.debug("actor %s spawned to wait for a promotion (pid %d)", spec.name, actor.pid)
            return
        log.info("actor %s started (pid %d)", spec.name, actor.pid,
                 extra=event("actor.started", actor_name=spec.name, actor_pid=actor.pid))
        self.publish("actor.started", actor)

    def _release(self, actor: ActorProcess) -> None:
        """Let a gated actor recover: its wave has come."""
        if actor.start_gate is None:
            return
        try:
            os.write(actor.start_gate, b"\1")
        except BrokenPipeError:  # it died before reading it: ``_await_running`` says so
            pass
        os.close(actor.start_gate)
        actor.start_gate = None
        actor.held = False
        actor.last_heartbeat_ms = actor.spawned_at_ms = monotonic_ms()

    def _await_running(self, actor: ActorProcess) -> None:
        deadline = monotonic_ms() + self.config.actor_start_timeout_ms
        while actor.lifecycle != "RUNNING":
            if actor.process is not None and actor.process.poll() is not None:
                code = actor.process.returncode  # before the shutdown lets the process go
                self.shutdown()
                logs = self.store_dir / LOG_DIR / actor.spec.name
                reason = last_line(logs.with_suffix(".stderr"), actor.stderr_offset)
                raise EngineError(f"actor {actor.spec.name} exited with code {code} while starting"
                                  f"{': ' + reason if reason else ''}; see {logs}.log and {logs}.stderr")
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
        with _signal_wakeup() as wakeup:
            if wakeup is not None:  # a signal (Ctrl-C) ends the poll; pyzmq would resume it, up to 100 ms
                poller.register(wakeup, zmq.POLLIN)
            self._loop(poller, wakeup)

    def _loop(self, poller: zmq.Poller, wakeup: socket.socket | None) -> None:
        while not self.stopping:
            ready = dict(poller.poll(100))
            if wakeup is not None and wakeup in ready:
                _drain(wakeup)
            if self.heartbeats in ready:
                self._drain_heartbeats()
            if self.control in ready:
                self._drain_control()
            self._reconcile(monotonic_ms())
            if self.parent_pid is not None and not self.stopping and os.getppid() != self.parent_pid:
                log.error("the process that started the engine (pid %d) is gone; stopping", self.parent_pid)
                self.request_stop()

    def _drain_heartbeats(self) -> None:
        for _ in range(1000):
            try:
                beat = heartbeat_decoder.decode(self.heartbeats.recv(zmq.NOBLOCK))
            except zmq.Again:
                return
            actor = self.actors.get(beat.name)
            if actor is None or beat.pid != actor.pid:
                continue
            if actor.lifecycle != "RUNNING" and beat.lifecycle == "RUNNING":
                took_ms = monotonic_ms() - actor.spawned_at_ms
                log.info("actor %s recovered in %d ms (pid %d)", actor.spec.name, took_ms, actor.pid,
                         extra=event("recovery.done", actor_name=actor.spec.name, actor_pid=actor.pid,
                                     duration_ms=took_ms))
                self.publish("recovery.done", actor)
                self.publish("actor.running", actor)
            actor.lifecycle = supervised_step(actor.lifecycle, beat.lifecycle)
            actor.detail = beat.detail
            self._note_condition(actor, beat.condition)
            actor.last_heartbeat_ms = monotonic_ms()

    def _note_condition(self, actor: ActorProcess, condition: str) -> None:
        """Log when an actor starts or stops reporting a condition (not each change of its words:
        the free bytes in "disk full (need N bytes, F free)" move)."""
        if bool(condition) != bool(actor.condition):
            if condition:
                log.warning("engine DEGRADED: %s: %s", actor.spec.name, condition,
                            extra=event("engine.degraded", actor_name=actor.spec.name, reason=condition))
                self.publish("engine.degraded", actor)
            else:
                log.warning("%s: its condition cleared (%s)", actor.spec.name, actor.condition,
                            extra=event("engine.condition_cleared", actor_name=actor.spec.name))
                self.publish("engine.condition_cleared", actor)
        actor.condition = condition

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
                self._change_role()
                return ControlReply(ok=True, message="role changed")
            case KillCommand(name=name):
                actor = self.actors.get(name)
                if actor is None or actor.process is None:
                    return ControlReply(ok=False, message=f"no actor named {name!r}")
                actor.process.kill()
                return ControlReply(ok=True, message=f"killed {name} (pid {actor.pid})")

    def reasons(self) -> list[str]:
        """Why the engine is DEGRADED: each actor that does not run, each that runs and reports a
        condition (a disk that refuses its writes). Empty: RUNNING."""
        down = [f"{a.spec.name} {'GAVE_UP' if a.gave_up else a.lifecycle}" for a in self.actors.values()
                if a.lifecycle != "RUNNING"]
        return down + [f"{a.spec.name}: {a.condition}" for a in self.actors.values()
                       if a.lifecycle == "RUNNING" and a.condition]

    def status(self) -> ControlReply:
        actors = [ActorStatus(a.spec.name, a.pid, Lifecycle.GAVE_UP if a.gave_up else a.lifecycle, a.restarts,
                              {**a.detail, **_resources(a.pid)}, a.condition)
                  for a in self.actors.values()]
        reasons = self.reasons()
        return ControlReply(ok=True, state="DEGRADED" if reasons else "RUNNING", endpoint=self.config.endpoint,
                            actors=actors, offsets=self.offsets.snapshot(self.config.consume_queue_owner_count),
                            reasons=reasons)

    def _reconcile(self, now: int) -> None:
        for actor in self.actors.values():
            process = actor.process
            if process is not None and process.poll() is not None:
                self._on_exit(actor, process.returncode, now)
            elif process is not None and actor.kill_at_ms is not None:
                if now >= actor.kill_at_ms:
                    process.kill()
                    actor.kill_at_ms = None
            elif process is not None and actor.lifecycle == "RUNNING" \
                    and now - actor.last_heartbeat_ms > self.config.heartbeat_timeout_ms:
                silent_ms = now - actor.last_heartbeat_ms
                log.error("actor %s (pid %d) sent no heartbeat for %d ms; dumping its stacks, then killing it",
                          actor.spec.name, actor.pid, silent_ms,
                          extra=event("actor.hung", actor_name=actor.spec.name, actor_pid=actor.pid,
                                      silent_ms=silent_ms))
                os.kill(actor.pid, signal.SIGUSR1)  # a stopped process dumps when killed: nothing lost
                os.kill(actor.pid, signal.SIGCONT)
                actor.kill_at_ms = now + _STACK_DUMP_GRACE_MS
            elif process is None and actor.restart_at_ms is not None and now >= actor.restart_at_ms:
                actor.restarts += 1
                self._spawn(actor)
                log.info("actor %s restarted (pid %d, restart %d)", actor.spec.name, actor.pid, actor.restarts,
                         extra=event("actor.restarted", actor_name=actor.spec.name, actor_pid=actor.pid,
                                     restarts=actor.restarts))
                self.publish("actor.restarted", actor)

    def _on_exit(self, actor: ActorProcess, code: int, now: int) -> None:
        log.warning("actor %s (pid %d) %s", actor.spec.name, actor.pid, _how_it_ended(code),
                    extra=event("actor.exited", actor_name=actor.spec.name, actor_pid=actor.pid, exit_code=code,
                                signal=_signal_name(code)))
        self.publish("actor.exited", actor, exit_code=code)
        actor.process = None
        actor.lifecycle = supervised_step(actor.lifecycle, Lifecycle.DOWN)
        actor.condition = ""  # a new process reports its own
        actor.kill_at_ms = None
        window = self.config.restart_window_ms
        while actor.restart_times and now - actor.restart_times[0] > window:
            actor.restart_times.popleft()
        if len(actor.restart_times) >= self.config.restart_count_max:
            actor.gave_up = True
            log.error("actor %s restarted %d times within %d ms; leaving it down", actor.spec.name,
                      len(actor.restart_times), window,
                      extra=event("actor.gave_up", actor_name=actor.spec.name, restarts=len(actor.restart_times),
                                  window_ms=window))
            self.publish("actor.gave_up", actor)
            return
        # The first restart in a window is immediate (serving again fast matters most);
        # later ones back off exponentially, so a crash loop does not spin.
        recent = len(actor.restart_times)
        backoff = 0 if recent == 0 else self.config.restart_backoff_ms * (2 ** (recent - 1))
        actor.restart_times.append(now)
        actor.restart_at_ms = now + min(backoff, 10_000)

    def publish(self, kind: str, actor: ActorProcess | None = None, *, exit_code: int = 0) -> None:
        event = Event(kind, actor.spec.name if actor else "", actor.pid if actor else 0, exit_code,
                      time.time_ns() // 1_000_000)
        self.events.send_multipart([endpoints.TOPIC_EVENT, encoder.encode(event)])

    # -- stop --------------------------------------------------------------

    def shutdown(self) -> bool:
        """Stop every actor in reverse start order; True if the stop was clean."""
        log.info("engine stopping", extra=event("engine.stopping"))
        self.publish("engine.stopping")
        self._drop_standby()
        clean = True
        for wave in sorted({actor.spec.wave for actor in self.actors.values()}, reverse=True):
            stopping = [actor for actor in reversed(self.actors.values()) if actor.spec.wave == wave]
            for actor in stopping:  # an actor's stop waits for nothing of another in its wave
                self._signal_stop(actor)
            for actor in stopping:
                clean &= self._stop_actor(actor, signalled=True)
        caught_up = self.offsets.get(DISPATCHED) >= self.offsets.get(CONFIRMED)
        if clean and caught_up:
            (self.store_dir / ABORT_FILE).unlink(missing_ok=True)
            log.info("engine stopped cleanly", extra=event("engine.stopped", clean=True))
        else:
            log.warning("stopped abnormally (clean=%s, dispatcher caught up=%s); keeping the abort marker",
                        clean, caught_up, extra=event("engine.stopped", clean=False))
        self.publish("engine.stopped")
        for sock in (self.control, self.events, self.heartbeats):
            sock.close()
        self.zctx.term()
        self.offsets.set(RUN_OVER, 1)  # a reader on the host (LocalReads) lets this run's offsets go
        self.offsets.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        os.close(self.lock_fd)
        return clean and caught_up

    @staticmethod
    def _signal_stop(actor: ActorProcess) -> None:
        if actor.start_gate is not None:  # a start that failed before its wave: it exits without recovering
            os.close(actor.start_gate)
            actor.start_gate = None
        elif actor.process is not None and actor.process.poll() is None:
            actor.process.send_signal(signal.SIGTERM)

    def _stop_actor(self, actor: ActorProcess, *, signalled: bool = False) -> bool:
        """Wait for the actor to stop (after a SIGTERM, sent here unless ``signalled``: a second one
        could reach it while Python is finalizing, with the default handler back, and kill it)."""
        process = actor.process
        if process is None:
            return actor.restart_at_ms is None and not actor.gave_up
        if not signalled:
            self._signal_stop(actor)
        try:
            code = wait_exit(process, self.config.actor_stop_timeout_ms / 1000)
        except subprocess.TimeoutExpired:
            log.error("actor %s did not stop within %d ms; killing it", actor.spec.name,
                      self.config.actor_stop_timeout_ms,
                      extra=event("actor.stop_timeout", actor_name=actor.spec.name, actor_pid=actor.pid))
            process.kill()
            code = process.wait()
        self._drain_heartbeats()
        self.publish("actor.exited", actor, exit_code=code)
        actor.process = None
        actor.lifecycle = supervised_step(actor.lifecycle, Lifecycle.STOPPED)
        if code != 0:
            log.warning("actor %s exited with code %d when asked to stop", actor.spec.name, code,
                        extra=event("actor.exited", actor_name=actor.spec.name, actor_pid=process.pid,
                                    exit_code=code, signal=_signal_name(code)))
        else:
            log.info("actor %s stopped (pid %d)", actor.spec.name, process.pid,
                     extra=event("actor.stopped", actor_name=actor.spec.name, actor_pid=process.pid))
        return code == 0 or actor.held  # one still held at its gate wrote nothing, whatever ended it


@contextlib.contextmanager
def _signal_wakeup() -> Iterator[socket.socket | None]:
    """A socket that turns readable when a signal arrives (``signal.set_wakeup_fd``); None off the
    main thread, where Python allows no wakeup fd."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    try:
        yield reader
    finally:
        signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()


def _drain(sock: socket.socket) -> None:
    sock.setblocking(False)
    try:
        while sock.recv(4096):
            pass
    except BlockingIOError:
        pass


def wait_exit(process: subprocess.Popen[bytes], timeout_s: float) -> int:
    """``process.wait(timeout_s)``, woken by the exit itself (a pidfd turns readable): Popen's own
    wait with a timeout sleeps between looks, up to 50 ms, and a stop waits once a wave."""
    if process.returncode is not None:
        return process.returncode
    try:
        pidfd = os.pidfd_open(process.pid)
    except OSError:  # no pidfd (Linux before 5.3)
        return process.wait(timeout_s)
    try:
        if not select.select([pidfd], [], [], timeout_s)[0]:
            raise subprocess.TimeoutExpired(process.args, timeout_s)
    finally:
        os.close(pidfd)
    return process.wait()


def degraded_note(reasons: list[str]) -> str:
    """What follows "ready ..." on a DEGRADED start: " DEGRADED: writer: ...; ..." ("" when RUNNING)."""
    return f" DEGRADED: {'; '.join(reasons)}" if reasons else ""


def _signal_name(code: int) -> str | None:
    """SIGKILL for a process that a signal ended (Popen's return code -9), else None."""
    if code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _how_it_ended(code: int) -> str:
    name = _signal_name(code)
    return f"exited with code {code}" if name is None else f"was killed by {name}"


def _rotate_if_full(path: Path, bytes_max: int, files_kept: int) -> None:
    """As the log handlers rotate ``<name>.log``: past ``bytes_max``, ``path`` becomes ``path.1``,
    ``path.1`` becomes ``path.2`` ..., and at most ``files_kept`` files remain (``path`` included).
    Runs before an actor starts, while nothing writes to ``path``."""
    try:
        if path.stat().st_size < bytes_max:
            return
    except FileNotFoundError:
        return
    for older in range(files_kept - 1, 0, -1):
        source = path.with_name(f"{path.name}.{older - 1}") if older > 1 else path
        if source.exists():
            os.replace(source, path.with_name(f"{path.name}.{older}"))
