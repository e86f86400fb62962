"""An actor's lifecycle moves only along its table; the states stay plain strings on the wire."""

from __future__ import annotations

import json

import msgspec
import pytest

from engine.ipc.lifecycle import ACTOR_STEPS, SUPERVISED_STEPS, Lifecycle, actor_step, supervised_step
from engine.ipc.messages import ActorStatus, Heartbeat, heartbeat_decoder

ACTOR_RUN = [Lifecycle.INIT, Lifecycle.RECOVERING, Lifecycle.RUNNING, Lifecycle.STOPPING, Lifecycle.STOPPED]


def test_an_actor_walks_its_lifecycle_forward_and_nothing_else() -> None:
    state = ACTOR_RUN[0]
    for new in ACTOR_RUN[1:]:
        state = actor_step(state, new)
    assert state is Lifecycle.STOPPED
    assert actor_step(Lifecycle.RECOVERING, Lifecycle.STOPPING) is Lifecycle.STOPPING  # SIGTERM while recovering
    for current, allowed in ACTOR_STEPS.items():
        for new in set(Lifecycle) - allowed:
            with pytest.raises(AssertionError, match="actor lifecycle"):
                actor_step(current, new)


@pytest.mark.parametrize(("current", "new"), [
    (Lifecycle.RUNNING, Lifecycle.RECOVERING),   # heartbeats never go back
    (Lifecycle.STOPPING, Lifecycle.RUNNING),
    (Lifecycle.DOWN, Lifecycle.RUNNING),         # a dead process reports nothing: it is spawned first
    (Lifecycle.RUNNING, Lifecycle.STARTING),     # a live one is not spawned again
    (Lifecycle.STOPPED, Lifecycle.RUNNING),
    (Lifecycle.DOWN, Lifecycle.GAVE_UP),         # shown by status only
])
def test_the_supervisor_refuses_a_step_back(current: Lifecycle, new: Lifecycle) -> None:
    with pytest.raises(AssertionError, match="supervised lifecycle"):
        supervised_step(current, new)


def test_the_supervisor_follows_a_start_a_crash_and_a_stop() -> None:
    state = Lifecycle.DOWN
    for new in (Lifecycle.STARTING, Lifecycle.RECOVERING, Lifecycle.RUNNING, Lifecycle.RUNNING,  # beat after beat
                Lifecycle.DOWN,                                                                  # SIGKILLed
                Lifecycle.STARTING, Lifecycle.RUNNING,                                           # RECOVERING unseen
                Lifecycle.STOPPING, Lifecycle.STOPPED, Lifecycle.STOPPED):                       # reported, then waited
        state = supervised_step(state, new)
    assert set(SUPERVISED_STEPS) == set(Lifecycle) - {Lifecycle.GAVE_UP}


def test_the_wire_and_json_carry_the_same_strings_as_before() -> None:
    beat = Heartbeat("writer", 42, Lifecycle.RUNNING, {})
    encoded = msgspec.msgpack.encode(beat)
    assert encoded == msgspec.msgpack.encode(["heartbeat", "writer", 42, "RUNNING", {}, ""])  # "": no condition
    assert heartbeat_decoder.decode(encoded).lifecycle is Lifecycle.RUNNING
    older = heartbeat_decoder.decode(msgspec.msgpack.encode(["heartbeat", "writer", 42, "RUNNING", {}]))
    assert (older.lifecycle, older.condition) == (Lifecycle.RUNNING, "")  # one without the condition field
    with pytest.raises(msgspec.ValidationError):  # a state no table knows is refused where it is decoded
        heartbeat_decoder.decode(msgspec.msgpack.encode(["heartbeat", "writer", 42, "WALKING", {}]))
    status = ActorStatus("front", 7, Lifecycle.GAVE_UP, 5, {})
    assert json.loads(msgspec.json.encode(status))["lifecycle"] == "GAVE_UP"
    assert json.dumps({"state": status.lifecycle}) == '{"state": "GAVE_UP"}'
    assert f"{Lifecycle.DOWN:<6}|" == "DOWN  |"
