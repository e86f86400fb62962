"""The supervisor's part in the simulation: production's decisions, carried out in a world.

``supervisor/decisions.py`` decides what a start, a change of role and a stop do; the real
supervisor carries its effects out with processes, and ``SimSupervisor`` carries out the same
list here: a spawn is nothing yet (no interpreter to start), a wave starts its actors (each
recovers at once, in order), a kill is the world's SIGKILL, a stop wave stops its actors in any
order while the earlier waves keep working. The effects on the store and the run directory
(the cut of the log, the crash-start marker, the slots) are production's own code
(``supervisor/store_effects.py``). So a bug in the supervisor's choreography is a bug here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from random import Random
from typing import Protocol

from engine.actors.base import Port
from engine.actors.specs import ActorSpec
from engine.config import StoreConfig
from engine.coordination.role import Role
from engine.ipc.channels import CONTROL
from engine.ipc.messages import ControlReply, RoleChanged, control_request_decoder, encoder
from engine.store.shared_offsets import WRITTEN, SharedOffsets
from harness.simulation.network import Network
from supervisor import store_effects
from supervisor.decisions import (
    CutLog,
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

STOP_WAVE_OVERLAP_STEPS_MAX = 8  # steps of the other waves' work while one wave exits


class Host(Protocol):
    """What the simulated supervisor needs of its world (``world.World``)."""

    config: StoreConfig
    specs: dict[str, ActorSpec]
    prefix: str
    store_dir: Path
    run_dir: Path
    slots: SharedOffsets
    network: Network
    down: dict[str, int]
    rng: Random

    @property
    def actors(self) -> Mapping[str, object]: ...
    def start(self, name: str) -> None: ...
    def kill(self, name: str) -> None: ...
    def stop(self, name: str) -> None: ...
    def deliver(self, may_die: bool) -> bool: ...
    def job_one(self) -> bool: ...
    def trace(self, line: str) -> None: ...


class SimSupervisor:
    """One engine's supervisor: its decisions, and the world it carries them out in."""

    def __init__(self, host: Host, config: StoreConfig) -> None:
        self.host = host
        self.base_config = config
        self.decisions = Decisions(config)
        self.cuts = 0  # logs cut at a change of role
        self.follows_kept = 0  # new masters followed with the actors kept (the log did not fork)
        self.kept_since: list[tuple[Role, int]] = []  # each such follow's role and the log's end then

    @property
    def role(self) -> Role | None:
        return self.decisions.role

    def start(self, *, crash_start: bool, power_loss: bool = False) -> None:
        """The supervisor's start: the decisions begin afresh, as a new supervisor process's do, and
        its control socket listens (the membership actor tells it its role there)."""
        self.decisions = Decisions(self.base_config)
        self.host.network.attach(self.name, [Port(CONTROL, bind=True)])
        self.host.config = self.base_config
        self.host.specs = self._specs()
        self.carry_out(self.decisions.start(crash_start=crash_start, power_loss=power_loss))

    @property
    def name(self) -> str:
        return self.host.prefix + "supervisor"

    def died(self) -> None:
        """SIGKILL: what was queued on its control socket is lost with it."""
        self.host.network.detach(self.name)

    def take_control(self) -> None:
        """What the control socket holds, as the supervisor's loop takes it: a role the membership
        actor tells (its payload decides), answered as the real supervisor answers."""
        network = self.host.network
        for key in [key for key in network.busy() if key[0] == self.name]:
            for frames in network.take(key, len(network.queues[key])):
                sender, payload = frames[0].decode(), frames[-1]
                request = control_request_decoder.decode(payload)
                assert isinstance(request, RoleChanged), request
                network.push(sender, CONTROL.name, self.name, [encoder.encode(ControlReply(ok=True))])
                self.carry_out(self.decisions.role_changed(Role.of(request)))

    def stop(self) -> None:
        self.carry_out(self.decisions.stop())

    def carry_out(self, effects: list[Effect]) -> None:
        host, prefix = self.host, self.host.prefix
        for effect in effects:
            if isinstance(effect, CutLog):
                if store_effects.cut_log(host.store_dir, host.run_dir, effect.role) is not None:
                    self.cuts += 1
                    host.trace(f"{prefix}: its log cut where it forks from epoch {effect.role.epoch}'s")
                continue
            if store_effects.carry_out(effect, host.store_dir, host.run_dir, host.slots):
                continue
            match effect:
                case WriteSettings(config=config):
                    host.config = config
                    host.specs = self._specs()
                case Spawn() | KeepStandby() | KeepSpare() | DropStandby():
                    pass  # a process held at its gate has not touched the store: nothing to simulate
                case StartWave(names=names):
                    for name in names:
                        host.start(prefix + name)
                case Kill(names=names):
                    for name in names:
                        if prefix + name in host.actors:
                            host.kill(prefix + name)
                        host.down.pop(prefix + name, None)  # the role that ends: not started again
                case StopWave(names=names):
                    self._stop_wave([prefix + name for name in names if prefix + name in host.actors])
                case ForkCheck(role=role, forked=forked, kept=kept):
                    forks = store_effects.forks(host.store_dir, host.run_dir, role)
                    if not forks:
                        self.follows_kept += 1
                        self.kept_since.append((role, host.slots.get(WRITTEN)))
                        host.trace(f"{prefix}supervisor: follows epoch {role.epoch}'s master, its actors kept")
                    self.carry_out(list(forked if forks else kept))
                case Publish(kind=kind):
                    host.trace(f"{prefix}supervisor: {kind}")

    def _stop_wave(self, names: list[str]) -> None:
        host = self.host
        host.rng.shuffle(names)
        for name in names:
            if name in host.actors:
                host.stop(name)
        for _ in range(host.rng.randrange(STOP_WAVE_OVERLAP_STEPS_MAX)):  # the next wave works while this one exits
            if not host.actors or not (host.deliver(may_die=False) or host.job_one()):
                break

    def _specs(self) -> dict[str, ActorSpec]:
        return {self.host.prefix + name: spec for name, spec in self.decisions.specs.items()}
