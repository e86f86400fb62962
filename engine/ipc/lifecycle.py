"""An actor's lifecycle: the states, and the moves between them that are allowed.

Two views of the same process, one enum (the strings are the wire's and the JSON's):

* the actor's own, reported in every ``Heartbeat`` (``engine/actors/base.py``, the gRPC
  endpoint, the simulation)::

      INIT -> RECOVERING -> RUNNING -> STOPPING -> STOPPED

  A SIGTERM during recovery ends the loop before it starts, so STOPPING may follow
  RECOVERING. The actor moves with ``actor_step``.

* the supervisor's, per actor (``supervisor/supervisor.py``)::

      DOWN -> STARTING -> (what the heartbeats report, forward only) -> DOWN | STOPPED
                 \\______________________________________________________/
                                   the process exited / was stopped

  DOWN is a process that exited and waits for its restart; STARTING a process spawned that
  has not reported yet; STOPPED one the supervisor stopped (or that reported it stopped).
  Heartbeats are sampled, so the supervisor's view may skip an actor state, never go back.
  The supervisor moves with ``supervised_step``. GAVE_UP is shown by ``status`` for an actor
  left down after too many restarts; no step leads to it.

A step that the tables do not allow is a bug of ours: it is asserted.
"""

from __future__ import annotations

import enum


class Lifecycle(enum.StrEnum):
    INIT = "INIT"
    RECOVERING = "RECOVERING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    # the supervisor's view only
    DOWN = "DOWN"
    STARTING = "STARTING"
    GAVE_UP = "GAVE_UP"  # status only: left down after restart_count_max restarts


_ACTOR_ORDER = (Lifecycle.INIT, Lifecycle.RECOVERING, Lifecycle.RUNNING, Lifecycle.STOPPING, Lifecycle.STOPPED)

# The actor's own moves: each to the next state, and RECOVERING straight to STOPPING.
ACTOR_STEPS: dict[Lifecycle, frozenset[Lifecycle]] = {
    Lifecycle.INIT: frozenset({Lifecycle.RECOVERING}),
    Lifecycle.RECOVERING: frozenset({Lifecycle.RUNNING, Lifecycle.STOPPING}),
    Lifecycle.RUNNING: frozenset({Lifecycle.STOPPING}),
    Lifecycle.STOPPING: frozenset({Lifecycle.STOPPED}),
    Lifecycle.STOPPED: frozenset(),
}

_ENDS = frozenset({Lifecycle.DOWN, Lifecycle.STOPPED})  # the process exited, or was stopped

# The supervisor's view: a spawn from DOWN; from STARTING or a reported state, any reported
# state at or after it (or the same one, beat after beat), or an end.
SUPERVISED_STEPS: dict[Lifecycle, frozenset[Lifecycle]] = {
    Lifecycle.DOWN: frozenset({Lifecycle.STARTING}),
    Lifecycle.STARTING: frozenset(_ACTOR_ORDER) | _ENDS,
    **{state: frozenset(_ACTOR_ORDER[i:]) | _ENDS for i, state in enumerate(_ACTOR_ORDER)},
}
# A process that reported STOPPED may still exit (DOWN) before the supervisor waits for it.
assert Lifecycle.DOWN in SUPERVISED_STEPS[Lifecycle.STOPPED]
assert Lifecycle.GAVE_UP not in SUPERVISED_STEPS


def actor_step(current: Lifecycle, new: Lifecycle) -> Lifecycle:
    """``new``, once checked as a move the actor may make from ``current``."""
    assert new in ACTOR_STEPS[current], f"actor lifecycle {current} -> {new}"
    return new


def supervised_step(current: Lifecycle, new: Lifecycle) -> Lifecycle:
    """``new``, once checked as a move the supervisor's view of an actor may make from ``current``."""
    assert new in SUPERVISED_STEPS[current], f"supervised lifecycle {current} -> {new}"
    return new
