"""The dashboard's rates (``engine/dashboard/api.py``): intervals from the monotonic clock, so a
wall clock set back or ahead neither spikes a rate nor hides one."""

from __future__ import annotations

import pytest

from engine.dashboard.api import Rates

pytestmark = pytest.mark.timeout(10)


def test_a_wall_clock_set_back_or_ahead_changes_no_rate() -> None:
    rates = Rates(seconds_kept=10)
    rates.sample((0, 0), wall_ms=1_000_000, mono_ms=5_000)
    rates.sample((100, 50), wall_ms=1_001_000, mono_ms=6_000)
    rates.sample((200, 100), wall_ms=1_001_000 - 3_600_000, mono_ms=7_000)  # an hour back
    rates.sample((300, 150), wall_ms=1_003_000 + 3_600_000, mono_ms=8_000)  # and an hour ahead
    assert [(r["sent"], r["pulled"]) for r in rates.series()] == [(100.0, 50.0)] * 3
    assert [r["t"] for r in rates.series()] == [1_001_000, 1_001_000 - 3_600_000, 1_003_000 + 3_600_000]
