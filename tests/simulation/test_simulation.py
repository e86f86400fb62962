"""The seeded simulation: a few hundred seeds pass, a seed replays exactly, and a broken ordering is caught.

Each seed runs every actor's logic in-process over a simulated network and disk,
with kills, power cuts and torn pages (``engine/simulation``). ``scripts/simulate.py``
runs thousands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine.actors.flusher import FlusherActor
from engine.services.restart_points import checkpoint_dispatched
from engine.simulation import Plan, simulate
from engine.store.shared_offsets import INDEX_APPLIED, owner_slot

pytestmark = pytest.mark.timeout(300)

SEEDS = 300  # the slow run; the default run takes the first 40


@pytest.mark.parametrize("seeds", [pytest.param(40, id="40"), pytest.param(SEEDS, id="300", marks=pytest.mark.slow)])
def test_hundreds_of_seeds_keep_every_invariant(seeds: int) -> None:
    failures = {}
    power_cuts = kills = 0
    for seed in range(seeds):
        outcome = simulate(seed)
        power_cuts += outcome.figures["power_cuts"]
        kills += outcome.figures["kills"]
        if not outcome.ok:
            failures[seed] = outcome.violations[:3]
    assert not failures, f"failing seeds (replay with scripts/simulate.py --seed N --trace): {failures}"
    assert power_cuts >= seeds // 4 and kills >= seeds, "the runs must cut the power and kill actors"


# Seeds that once broke an invariant, with the plan that found them; each runs in the default
# test run, and must keep passing.
PINNED_SEEDS = [
    # First hour 22: a slot the restarted timer reached again was checkpointed with a start past
    # its earlier moves, and a second restart within the slot moved its messages again. In both
    # seeds a power cut restarts the timer, and the supervisor dies within the slot the timer
    # reaches again (every actor stops on its own: the timer writes its checkpoint).
    (31, Plan(steps=1_500, supervisor_death_ratio=0.004)),
    (73, Plan(steps=1_500, supervisor_death_ratio=0.004)),
]


@pytest.mark.parametrize(("seed", "plan"), [pytest.param(seed, plan, id=str(seed)) for seed, plan in PINNED_SEEDS])
def test_pinned_seeds_keep_every_invariant(seed: int, plan: Plan) -> None:
    outcome = simulate(seed, plan)
    assert outcome.ok, f"replay with scripts/simulate.py --seed {seed} --trace: {outcome.violations[:5]}"


def test_a_seed_replays_exactly() -> None:
    first, second = simulate(7), simulate(7)
    assert (first.flush_mode, first.figures, first.trace) == (second.flush_mode, second.figures, second.trace)
    assert first.figures["deliveries"] > 100


_REPLAY = """
import json, sys
from engine.simulation import simulate
print(json.dumps([[o.flush_mode, o.figures, o.trace] for o in map(simulate, range(40))]))
"""


@pytest.mark.slow
def test_seeds_replay_the_same_in_another_process_with_another_hash_seed() -> None:
    """Nothing of the process leaks into a run: not its pid (once in message ids), not the order
    in which it iterates a set of strings (once the order in which parked pulls were answered)."""
    runs = [subprocess.run([sys.executable, "-c", _REPLAY], env={**os.environ, "PYTHONHASHSEED": str(hash_seed)},
                           capture_output=True, text=True, check=True, timeout=120).stdout
            for hash_seed in (1, 2)]
    assert json.loads(runs[0]) == json.loads(runs[1])


def test_a_checkpoint_taken_before_the_queues_are_flushed_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ordering the checkpoint depends on, broken on purpose: its dispatched offset taken from
    what the receivers applied instead of what they flushed. A power cut then loses units that
    the checkpoint promised, and recovery does not rebuild them."""

    def applied_not_durable(self: FlusherActor) -> int:
        applied = [self.slots.get(owner_slot(k)) for k in range(self.config.consume_queue_owner_count)]
        return checkpoint_dispatched([*applied, self.slots.get(INDEX_APPLIED)], self.checkpoint.dispatched_offset)

    monkeypatch.setattr(FlusherActor, "durable_dispatched_offset", applied_not_durable)
    failing = [seed for seed in range(60) if not simulate(seed).ok]
    assert failing, "the simulation missed a checkpoint that runs ahead of the flushed queues"


@pytest.mark.slow
def test_an_ack_answered_before_its_journal_is_on_disk_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """SYNC_FLUSH's promise for pop groups, broken on purpose: acks answered without waiting for
    their journal's fdatasync. A power cut then takes acks the client was told about, and their
    messages come back."""
    from engine.services.pop_states import PopStates

    def no_sync(self: PopStates) -> None:
        self.written.clear()

    monkeypatch.setattr(PopStates, "sync", no_sync)
    # The bug shows only when a cut follows an ack and takes the page of its journal entry, and
    # only under SYNC_FLUSH (ASYNC promises nothing across a power cut): cut more often, in that
    # mode only. About 2 seeds in 100 catch it.
    plan = Plan(power_cut_ratio=0.04, flush_mode="SYNC_FLUSH")
    failing = [seed for seed in range(150)
               if any("after its ack" in v for v in simulate(seed, plan).violations)]
    assert failing, "the simulation missed acks that a power cut took back"


def test_a_fifo_queue_that_does_not_lock_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """FIFO's rule broken on purpose: the owners treat the FIFO group as any other, so a pop gets a
    queue's next message while an earlier one is still invisible."""
    from engine import simulation

    real = simulation.sim_config
    monkeypatch.setattr(simulation, "sim_config", lambda flush_mode: real(flush_mode).replace(fifo_groups=()))
    failing = [seed for seed in range(40) if any("fifo" in v for v in simulate(seed).violations)]
    assert failing, "the simulation missed a FIFO group that gets messages out of order"


def test_a_timer_that_forgets_its_moves_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timer's restart rule broken on purpose: it never looks in the log for the moves it made
    before a kill (or a lost reply), so it delivers some messages twice."""
    from engine.actors.timer import TimerActor

    def never_look(self: TimerActor) -> None:
        self.look_pending = False

    monkeypatch.setattr(TimerActor, "look_for_moves", never_look)
    failing = [seed for seed in range(40) if any("moved twice" in v for v in simulate(seed).violations)]
    assert failing, "the simulation missed a delayed message delivered twice"
