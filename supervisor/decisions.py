"""The supervisor's decisions, as data: what a start, a change of role and a stop do.

``Decisions`` talks to nothing. It answers each event (start, the membership actor's new role,
stop) with a list of effects, in the order they must happen; ``supervisor.py`` carries them out
with processes, pipes and files, and the seeded simulation (``harness/simulation``) carries the
same list out in its world. Neither runtime decides anything, so the simulation runs the
supervisor's own choreography, not a copy of it.

A start (RocketMQ's DefaultMessageStore start, in waves; ``engine/actors/specs.py``)::

    CrashStart(True)?  Spawn(a) Spawn(b) ...  StartWave(wave 1) StartWave(wave 2) ...  CrashStart(False)

Every process is spawned first, held at its start gate, so that its interpreter and imports
overlap with the earlier waves' recovery; a wave is let through once the one before it runs. An
engine elected on etcd starts the membership actor alone; the rest waits for the role it decides.

A change of role (a replica promoted, a master stepped down)::

    WriteSettings(role's)  Spawn(each, standby_ok)  Kill(every other actor)  ResetSlots(kept)
    CutLog(role)  CrashStart(True)  StartWave ...  CrashStart(False)  Publish(role.changed)
    DropStandby()?  KeepStandby(...)?  KeepSpare(membership, receiver?)

A replica following a new master keeps its actors unless its log forks from the new master's::

    WriteSettings(role's)  Spawn(receiver, standby_ok)  Kill(receiver)
    ForkCheck(role, forked=(the change above, the receiver spawned already),
                    kept=(StartWave(receiver)  Publish(role.changed)  KeepSpare(membership, receiver)))

Its actors serve on meanwhile: the log they hold is a prefix of the new master's, and only the
receiver knew the old master (a surviving replica follows again in about 0.1 s, not after a
restart of every actor). The receiver that follows is the spare kept waiting at its gate: its
settings are read past the gate, and a new interpreter's imports took 0.3-0.4 s of the failover.

Killed, not stopped in order: the new actors recover as after a crash of processes anyway (the
page cache keeps what they wrote: no power-loss sweep of the log), and an orderly stop
of every wave took most of a failover's time (1.7 s of 4 on two cores). Every slot is reset as a
start finds it, but the membership actor's (a dispatched or durable offset past a cut would
mislead the new actors). A master elected again keeps its actors: only its epoch is noted.

Restarts of a dead actor back off (``Restarts``): the first in a window is immediate, later ones
double from ``restart_backoff_ms``, and past ``restart_count_max`` in ``restart_window_ms`` the
actor is left down (it is flapping: a restart will not cure it).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.actors.specs import MEMBERSHIP, RECEIVER, ActorSpec, actor_specs
from engine.config import StoreConfig
from engine.coordination.role import Role
from engine.store.shared_offsets import EPOCH, IN_SYNC_PUBLISHED, LEASE_DEADLINE

# The membership actor's slots: a change of role keeps them, every other is reset to 0.
MEMBERSHIP_SLOTS = frozenset((EPOCH, LEASE_DEADLINE, IN_SYNC_PUBLISHED))
RESTART_BACKOFF_MS_MAX = 10_000


@dataclass(frozen=True)
class Spawn:
    """A process for the actor, held at its start gate. ``standby_ok``: a process of its spec kept
    waiting (a master's actor on a replica, ``KeepStandby``, or a spare, ``KeepSpare``) may be taken
    instead, its imports done."""

    name: str
    standby_ok: bool = False


@dataclass(frozen=True)
class StartWave:
    """Let these spawned actors through their start gates (they recover), and wait until each runs."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class Kill:
    """SIGKILL these actors and reap them."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class StopWave:
    """SIGTERM these actors at once (one still held at its gate is let go without a byte) and wait
    until each exited; the actors of earlier waves keep working meanwhile."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class ResetSlots:
    """Every shared slot to 0 but ``kept``, as a start finds them."""

    kept: frozenset[int]


@dataclass(frozen=True)
class WriteSettings:
    """The settings the actors read when let through (the run directory's ``config.json``)."""

    config: StoreConfig


@dataclass(frozen=True)
class CutLog:
    """``engine.offline.truncate.prepare_for_role``: a master notes where its epoch starts, a
    replica's log is cut where it forks from its master's. A cut marks a crash start."""

    role: Role


@dataclass(frozen=True)
class ForkCheck:
    """A replica following a new master: whether its log forks from the new master's history
    (``engine.offline.truncate.fork_point``, read while the writer's appends are fenced off:
    ``engine/store/append_fence.py``). Then ``forked`` is carried out, else ``kept``."""

    role: Role
    forked: tuple[Effect, ...]
    kept: tuple[Effect, ...]


@dataclass(frozen=True)
class CrashStart:
    """The run directory's crash-start marker on or off: actors that recover while it is there
    recover as after an unclean stop; ``power_loss``: one the machine may not have survived
    (``engine/store/unclean_stop.py``), not only its processes."""

    on: bool
    power_loss: bool = False


@dataclass(frozen=True)
class KeepStandby:
    """Keep these master's actors spawned and held at their gates (a replica elected on etcd), so
    that a promotion does not wait for their interpreters."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class KeepSpare:
    """Keep a process of each of these actors spawned and held at its gate (and no other: the
    spares of actors not named are let go), for its next restart or ``Spawn``: it is let through
    instead of waiting for a new interpreter's imports (the membership actor's take 0.4 s idle and
    2 s on a busy master, as long as its etcd lease)."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class DropStandby:
    """Let the standby processes go: each exits at its gate."""


@dataclass(frozen=True)
class Publish:
    """An event on the supervisor's PUB socket (tests and tools wait on them)."""

    kind: str


Effect = Spawn | StartWave | Kill | StopWave | ResetSlots | WriteSettings | CutLog | ForkCheck | CrashStart \
    | KeepStandby | KeepSpare | DropStandby | Publish


class Decisions:
    """Which actors the engine runs, in which role, and what each event does to them."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.role: Role | None = None
        self.role_config = config  # the settings of the role the actors run in
        self.specs: dict[str, ActorSpec] = {spec.name: spec for spec in actor_specs(config)}

    def start(self, *, crash_start: bool, power_loss: bool = False) -> list[Effect]:
        """The engine's start (after an unclean stop: ``crash_start``, and ``power_loss`` if the
        machine may have gone down since). Elected on etcd: the membership actor alone (its role
        comes next, ``role_changed``); otherwise every actor, wave by wave."""
        marked: list[Effect] = [CrashStart(True, power_loss)] if crash_start else []
        if self.config.elected:
            return [*marked, Spawn(MEMBERSHIP), StartWave((MEMBERSHIP,))]
        return [*marked, *self._waves(list(self.specs)), CrashStart(False)]

    def role_changed(self, role: Role) -> list[Effect]:
        """The membership actor holds ``role``: the first one completes the start, a later one
        replaces the actors."""
        if role == self.role:
            return []
        previous, self.role = self.role, role
        if previous is not None and previous.is_master and role.is_master:  # elected again
            return [CutLog(role)]
        others = [name for name in self.specs if name != MEMBERSHIP]
        self.role_config = self.config.replace(replica_of="" if role.is_master else role.master_replication_endpoint,
                                               replica_of_broker_id=role.master_id)
        coming = [spec for spec in actor_specs(self.role_config) if spec.name != MEMBERSHIP]
        self.specs = {MEMBERSHIP: self.specs[MEMBERSHIP], **{spec.name: spec for spec in coming}}
        names = [spec.name for spec in coming]
        if previous is None:  # the start goes on: nothing else runs yet
            return [WriteSettings(self.role_config), CutLog(role), *self._waves(names), CrashStart(False)]
        if not previous.is_master and not role.is_master and RECEIVER in names:  # following another master
            running, spawned = ([name for name in names if name != RECEIVER] for names in (others, names))
            spares = self._spares()
            forked = self._replace(role, running, spawned, names) + self._standby() + spares
            kept = (StartWave((RECEIVER,)), Publish("role.changed"), *spares)
            return [WriteSettings(self.role_config), Spawn(RECEIVER, standby_ok=True), Kill((RECEIVER,)),
                    ForkCheck(role, forked=tuple(forked), kept=kept)]
        effects = [WriteSettings(self.role_config), *self._replace(role, others, names, names)]
        if role.is_master:
            effects.append(DropStandby())  # those a master does not run (a replica's next follow keeps them)
        return effects + self._standby() + self._spares()

    def _replace(self, role: Role, running: list[str], spawned: list[str], released: list[str]) -> list[Effect]:
        """Every actor replaced, as after a crash: ``spawned`` held at their gates (a master's from
        the standby ones), the ``running`` killed, the log cut where it forks, then ``released``."""
        return [*(Spawn(name, standby_ok=True) for name in spawned), Kill(tuple(running)),
                ResetSlots(MEMBERSHIP_SLOTS), CutLog(role), CrashStart(True),
                *self._releases(released), CrashStart(False), Publish("role.changed")]

    def stop(self) -> list[Effect]:
        """Every actor in reverse start order, a whole wave at a time; the standby and spare ones first."""
        effects: list[Effect] = [DropStandby(), KeepSpare(())]
        names = list(reversed(self.specs))
        for wave in sorted({spec.wave for spec in self.specs.values()}, reverse=True):
            effects.append(StopWave(tuple(name for name in names if self.specs[name].wave == wave)))
        return effects

    def ready(self) -> list[Effect]:
        """After the start: the standby and spare processes; their imports do not delay the start."""
        return self._standby() + self._spares()

    def _waves(self, names: list[str]) -> list[Effect]:
        return [*(Spawn(name) for name in names), *self._releases(names)]

    def _releases(self, names: list[str]) -> list[Effect]:
        waves = sorted({self.specs[name].wave for name in names})
        return [StartWave(tuple(name for name in names if self.specs[name].wave == wave)) for wave in waves]

    def _spares(self) -> list[Effect]:
        """An elected engine's spare membership actor (whose restart must renew its lease in time) and,
        on a replica, a spare receiver: the actor a follow of a new master replaces."""
        if not self.config.elected:
            return []
        return [KeepSpare(tuple(name for name in (MEMBERSHIP, RECEIVER) if name in self.specs))]

    def _standby(self) -> list[Effect]:
        """On a replica elected on etcd (``standby_master_actors``): a master's actors kept waiting."""
        if not (self.config.elected and self.config.standby_master_actors and self.role is not None
                and not self.role.is_master):
            return []
        master = actor_specs(self.config.replace(replica_of=""))
        return [KeepStandby(tuple(spec.name for spec in master if spec.name != MEMBERSHIP))]


@dataclass
class Restarts:
    """When a dead actor starts again: at once the first time in a window, then backing off."""

    backoff_ms: int
    count_max: int
    window_ms: int
    times: dict[str, deque[int]] = field(default_factory=dict)

    @classmethod
    def of(cls, config: StoreConfig) -> Restarts:
        return cls(config.restart_backoff_ms, config.restart_count_max, config.restart_window_ms)

    def after_exit(self, name: str, now_ms: int) -> int | None:
        """When the actor that died at ``now_ms`` starts again; None: it is left down (flapping)."""
        times = self.times.setdefault(name, deque())
        while times and now_ms - times[0] > self.window_ms:
            times.popleft()
        if len(times) >= self.count_max:
            return None
        recent = len(times)
        times.append(now_ms)
        return now_ms + min(0 if recent == 0 else self.backoff_ms * 2 ** (recent - 1), RESTART_BACKOFF_MS_MAX)

    def recent(self, name: str) -> int:
        return len(self.times.get(name, ()))
