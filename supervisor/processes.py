"""The actors' processes, as the supervisor runs them: spawned behind a start gate, let through,
signalled, reaped. What to do with them is decided elsewhere (``decisions.py``).

A start gate is a pipe: the actor waits on its read end before it touches the store
(``engine/actors/base.py``); a byte lets it recover, the pipe closed without one makes it exit 0.
Its raw stderr (a traceback, a stack dump) goes to ``logs/<name>.stderr``, rotated like the logs.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from engine.actors.specs import ActorSpec
from engine.config import StoreConfig
from engine.ipc.lifecycle import Lifecycle, supervised_step
from engine.logs import LOG_DIR, event
from supervisor.start_checks import last_line

log = logging.getLogger("supervisor")


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
    restart_at_ms: int | None = None
    spawned_at_ms: int = 0  # spawned, or let through its start gate: for the recovery time in the log
    start_gate: int | None = None  # the write end of the pipe it waits on before recovering (``release``)
    held: bool = False  # spawned and not yet let through its gate: it has not touched the store
    stderr_offset: int = 0  # where this run's raw stderr begins in <name>.stderr
    kill_at_ms: int | None = None  # a hung actor dumps its stacks, then is killed at this time
    gave_up: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class Spawner:
    """Starts actor processes of one engine: its store, run directory, settings file and lock."""

    store_dir: Path
    run_dir: Path
    config: StoreConfig
    config_path: Path
    lock_fd: int

    def spawn(self, actor: ActorProcess, *, gated: bool) -> None:
        """Start the actor's process; ``gated``: it waits, before it touches the store, until ``release``."""
        spec = actor.spec
        stderr_path = self.store_dir / LOG_DIR / f"{spec.name}.stderr"
        rotate_if_full(stderr_path, self.config.log_file_bytes_max, self.config.log_files_kept)
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


def kill_and_reap(actors: list[ActorProcess]) -> list[tuple[ActorProcess, int]]:
    """SIGKILL every actor that has a process, then reap each: (actor, exit code)."""
    running = [actor for actor in actors if actor.process is not None]
    for actor in running:
        actor.process.kill()  # type: ignore[union-attr]
    return [(actor, actor.process.wait()) for actor in running]  # type: ignore[union-attr]


def start_failure(actor: ActorProcess, store_dir: Path) -> str:
    """Why the start failed, for an actor that exited while starting: its raw stderr's last line."""
    code = actor.process.returncode if actor.process is not None else None
    logs = store_dir / LOG_DIR / actor.spec.name
    reason = last_line(logs.with_suffix(".stderr"), actor.stderr_offset)
    return (f"actor {actor.spec.name} exited with code {code} while starting{': ' + reason if reason else ''}; "
            f"see {logs}.log and {logs}.stderr")


def take_over(actor: ActorProcess, spare: ActorProcess) -> None:
    """``actor`` restarted as ``spare``, a process of its spec held at its gate: let through now."""
    actor.process, actor.start_gate, actor.stderr_offset = spare.process, spare.start_gate, spare.stderr_offset
    actor.lifecycle = supervised_step(actor.lifecycle, Lifecycle.STARTING)
    actor.restart_at_ms = None
    release(actor)


def release(actor: ActorProcess) -> None:
    """Let a gated actor recover: its wave has come."""
    if actor.start_gate is None:
        return
    try:
        os.write(actor.start_gate, b"\1")
    except BrokenPipeError:  # it died before reading it: waiting for it to run says so
        pass
    os.close(actor.start_gate)
    actor.start_gate = None
    actor.held = False
    actor.last_heartbeat_ms = actor.spawned_at_ms = monotonic_ms()


def signal_stop(actor: ActorProcess) -> None:
    """SIGTERM; an actor still held at its gate is let go without a byte (it exits without recovering)."""
    if actor.start_gate is not None:
        os.close(actor.start_gate)
        actor.start_gate = None
    elif actor.alive:
        assert actor.process is not None
        actor.process.send_signal(signal.SIGTERM)


class Standby:
    """Actors' processes kept spawned at their gates, until something takes them: a master's on a
    replica, for a promotion (``KeepStandby``); a spare for an actor's next restart (``KeepSpare``)."""

    def __init__(self, spawner: Callable[[ActorProcess], None], stop_timeout_ms: int) -> None:
        self.spawn = spawner
        self.stop_timeout_ms = stop_timeout_ms
        self.waiting: dict[str, ActorProcess] = {}

    def keep(self, specs: list[ActorSpec]) -> None:
        for spec in specs:
            waiting = self.waiting.get(spec.name)
            if waiting is None or not waiting.alive:
                actor = self.waiting[spec.name] = ActorProcess(spec)
                self.spawn(actor)
                log.debug("actor %s spawned to wait at its gate (pid %d)", spec.name, actor.pid)

    def take(self, spec: ActorSpec) -> ActorProcess | None:
        """The waiting process of ``spec``, if one waits alive with the same spec."""
        ready = self.waiting.pop(spec.name, None)
        return ready if ready is not None and ready.spec == spec and ready.alive else None

    def keep_only(self, specs: list[ActorSpec]) -> None:
        """Exactly these waiting: the others let go, the missing spawned."""
        names = {spec.name for spec in specs}
        self.drop([name for name in self.waiting if name not in names])
        self.keep(specs)

    def drop(self, names: list[str] | None = None) -> None:
        """Let the waiting actors go (``names``: these only): the pipe closed without a byte, each
        exits at its gate."""
        going = [self.waiting.pop(name) for name in (list(self.waiting) if names is None else names)]
        for actor in going:
            signal_stop(actor)
        for actor in going:
            if actor.process is not None:
                try:
                    wait_exit(actor.process, self.stop_timeout_ms / 1000)
                except subprocess.TimeoutExpired:
                    actor.process.kill()
                    actor.process.wait()


def wait_stopped(actor: ActorProcess, timeout_ms: int) -> int:
    """Wait for the signalled actor to exit (a second SIGTERM could reach it while Python is
    finalizing, with the default handler back, and kill it), killing it after ``timeout_ms``."""
    process = actor.process
    assert process is not None
    try:
        code = wait_exit(process, timeout_ms / 1000)
    except subprocess.TimeoutExpired:
        log.error("actor %s did not stop within %d ms; killing it", actor.spec.name, timeout_ms,
                  extra=event("actor.stop_timeout", actor_name=actor.spec.name, actor_pid=actor.pid))
        process.kill()
        code = process.wait()
    if code != 0:
        log.warning("actor %s exited with code %d when asked to stop", actor.spec.name, code,
                    extra=event("actor.exited", actor_name=actor.spec.name, actor_pid=process.pid,
                                exit_code=code, signal=signal_name(code)))
    else:
        log.info("actor %s stopped (pid %d)", actor.spec.name, process.pid,
                 extra=event("actor.stopped", actor_name=actor.spec.name, actor_pid=process.pid))
    return code


def resources(pid: int) -> dict[str, int]:
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


def signal_name(code: int) -> str | None:
    """SIGKILL for a process that a signal ended (Popen's return code -9), else None."""
    if code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def how_it_ended(code: int) -> str:
    name = signal_name(code)
    return f"exited with code {code}" if name is None else f"was killed by {name}"


def log_exit(actor: ActorProcess, code: int) -> None:
    log.warning("actor %s (pid %d) %s", actor.spec.name, actor.pid, how_it_ended(code),
                extra=event("actor.exited", actor_name=actor.spec.name, actor_pid=actor.pid, exit_code=code,
                            signal=signal_name(code)))


def rotate_if_full(path: Path, bytes_max: int, files_kept: int) -> None:
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
