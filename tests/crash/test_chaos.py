"""Twenty seeded kill cycles of random actors, the supervisor included, under load in both flush modes."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.chaos import run_chaos

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def test_twenty_random_kill_cycles_lose_nothing(store_dir: Path) -> None:
    report = run_chaos(store_dir, seed=20261122, cycles=20)
    print(report.summary(), report.schedule)
    assert len(report.schedule) == 20
    assert report.ok, report.summary() + "\n" + "\n".join(map(str, report.findings))
    assert report.verdict is not None and report.verdict.acked > 1000
    assert report.pop_verdict is not None and report.pop_verdict.acked > 500
