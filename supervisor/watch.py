"""The supervisor's watch over running actors: heartbeats, conditions, hung actors, exits and
restarts with back-off (``decisions.Restarts``). It reads and changes the supervisor's table of
actor processes; what it tells, it publishes through the supervisor."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable

from engine.config import StoreConfig
from engine.ipc.lifecycle import Lifecycle, supervised_step
from engine.ipc.messages import Heartbeat
from engine.logs import event
from supervisor.decisions import Restarts
from supervisor.processes import ActorProcess, log_exit, monotonic_ms

log = logging.getLogger("supervisor")

_STACK_DUMP_GRACE_MS = 300
Publish = Callable[..., None]


class Watch:
    def __init__(self, actors: dict[str, ActorProcess], config: StoreConfig, spawn: Callable[[ActorProcess], None],
                 publish: Publish) -> None:
        self.actors = actors  # the supervisor's own table: changed in place by both
        self.config = config
        self.spawn = spawn  # an actor's process, not held at a gate: a restart recovers at once
        self.publish = publish
        self.restart_plan = Restarts.of(config)

    def heartbeat(self, beat: Heartbeat) -> None:
        actor = self.actors.get(beat.name)
        if actor is None or beat.pid != actor.pid:
            return
        if actor.lifecycle != "RUNNING" and beat.lifecycle == "RUNNING":
            took_ms = monotonic_ms() - actor.spawned_at_ms
            log.info("actor %s recovered in %d ms (pid %d)", actor.spec.name, took_ms, actor.pid,
                     extra=event("recovery.done", actor_name=actor.spec.name, actor_pid=actor.pid,
                                 duration_ms=took_ms))
            self.publish("recovery.done", actor)
            self.publish("actor.running", actor)
        actor.lifecycle = supervised_step(actor.lifecycle, beat.lifecycle)
        actor.detail = beat.detail
        self.note_condition(actor, beat.condition)
        actor.last_heartbeat_ms = monotonic_ms()

    def note_condition(self, actor: ActorProcess, condition: str) -> None:
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

    def reasons(self) -> list[str]:
        """Why the engine is DEGRADED: each actor that does not run, each that runs and reports a
        condition (a disk that refuses its writes). Empty: RUNNING."""
        down = [f"{a.spec.name} {'GAVE_UP' if a.gave_up else a.lifecycle}" for a in self.actors.values()
                if a.lifecycle != "RUNNING"]
        return down + [f"{a.spec.name}: {a.condition}" for a in self.actors.values()
                       if a.lifecycle == "RUNNING" and a.condition]

    def reconcile(self, now: int) -> None:
        for actor in self.actors.values():
            process = actor.process
            if process is not None and process.poll() is not None:
                self.on_exit(actor, process.returncode, now)
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
                self.spawn(actor)
                log.info("actor %s restarted (pid %d, restart %d)", actor.spec.name, actor.pid, actor.restarts,
                         extra=event("actor.restarted", actor_name=actor.spec.name, actor_pid=actor.pid,
                                     restarts=actor.restarts))
                self.publish("actor.restarted", actor)

    def on_exit(self, actor: ActorProcess, code: int, now: int) -> None:
        log_exit(actor, code)
        self.publish("actor.exited", actor, exit_code=code)
        actor.process = None
        actor.lifecycle = supervised_step(actor.lifecycle, Lifecycle.DOWN)
        actor.condition = ""  # a new process reports its own
        actor.kill_at_ms = None
        actor.restart_at_ms = self.restart_plan.after_exit(actor.spec.name, now)
        if actor.restart_at_ms is None:
            actor.gave_up = True
            window = self.config.restart_window_ms
            restarts = self.restart_plan.recent(actor.spec.name)
            log.error("actor %s restarted %d times within %d ms; leaving it down", actor.spec.name, restarts, window,
                      extra=event("actor.gave_up", actor_name=actor.spec.name, restarts=restarts, window_ms=window))
            self.publish("actor.gave_up", actor)

