"""The seeded simulation of a consumer group sharing a topic's queues (harness/group_simulation.py):
the fronts' membership and the members' decisions, under members that come, go, die and stall,
lost heartbeats, fronts that restart and, over two broker sets, a set that fails over. Every seed
must keep one reader per queue at a time and hand out every acknowledged message; planted bugs of
a member must be caught."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from harness.group_simulation import simulate_group
from rmqpy._member_state import MemberState

pytestmark = pytest.mark.timeout(300)


def failing(seeds: range, **options: Any) -> dict[int, list[str]]:
    runs = {seed: simulate_group(seed, **options) for seed in seeds}
    return {seed: run.violations[:3] for seed, run in runs.items() if not run.ok}


def test_two_hundred_seeds_keep_one_reader_per_queue_and_hand_out_everything() -> None:
    assert failing(range(200)) == {}


def test_a_hundred_seeds_over_two_broker_sets_one_failing_over_at_times() -> None:
    assert failing(range(100), sets=2) == {}


@pytest.mark.slow
def test_three_thousand_seeds() -> None:
    assert failing(range(200, 3_200)) == {}


@pytest.mark.slow
def test_two_thousand_seeds_over_two_broker_sets() -> None:
    assert failing(range(100, 2_100), sets=2) == {}


class Greedy(MemberState):
    """Planted bug: reads its whole share at once, granted or not."""

    def share(self, held: Sequence[int], now: float) -> tuple[list[int], list[int]] | None:
        shared = super().share(held, now)
        return None if shared is None else (shared[1], shared[1])

    def keeps(self, held: Sequence[int], now: float) -> list[int]:
        view = self.view
        return [] if view is None or view.stale(now) else list(held)


class ClaimsWhatItLost(MemberState):
    """Planted bug: after its session ended it still says it reads its queues, and takes the reply
    to a heartbeat sent before: a front that just restarted gives the queues back to it."""

    def request(self, now: float, *, leaving: bool = False) -> dict[str, Any]:
        return {**super().request(now, leaving=leaving), "held": list(self.held)}

    def on_reply(self, reply: dict[str, Any], sent_at: float, now: float, number: int) -> None:
        super().on_reply(reply, sent_at, sent_at, number)


@pytest.mark.parametrize("sets", [1, 2])
def test_a_member_reading_queues_not_granted_is_caught(sets: int) -> None:
    found = failing(range(20), member_factory=Greedy, sets=sets)
    assert found and all("also reads queue" in " ".join(v) for v in found.values()), found


def test_a_member_claiming_again_what_it_lost_is_caught() -> None:
    assert failing(range(200), member_factory=ClaimsWhatItLost)


def test_a_seed_replays_exactly() -> None:
    first, again = simulate_group(3), simulate_group(3)
    assert (first.trace, first.handed_out) == (again.trace, again.handed_out)
    assert first.front_restarts > 0 and first.handed_out > 1_000
    two_sets = simulate_group(3, sets=2)
    assert two_sets.trace == simulate_group(3, sets=2).trace
    assert any("master fails" in line for line in two_sets.trace), "seed 3 fails a set over"
