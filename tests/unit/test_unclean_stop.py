"""Which unclean stop a start follows: a kill of processes, or a possible power cut
(``engine/store/unclean_stop.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.store.unclean_stop import (
    KILLED,
    POWER_LOSS,
    abort_note,
    boot_id,
    crash_start_kind,
    mark_crash_start,
    power_loss_possible,
)

pytestmark = pytest.mark.timeout(10)


def test_the_abort_note_of_this_boot_rules_a_power_cut_out() -> None:
    assert boot_id(), "/proc/sys/kernel/random/boot_id is readable on Linux"
    assert not power_loss_possible(abort_note())


@pytest.mark.parametrize("text", ["12345", "", "pid 7\nboot 00000000-0000-0000-0000-000000000000\n",
                                  "the log was cut\n", "pid 7\nboot \n"])
def test_any_other_note_may_follow_a_power_cut(text: str) -> None:
    assert power_loss_possible(text)


def test_a_power_loss_mark_is_never_taken_back_by_a_kill(tmp_path: Path) -> None:
    marker = tmp_path / "crash-start"
    assert crash_start_kind(marker) == ""
    mark_crash_start(marker, True)
    assert crash_start_kind(marker) == KILLED
    mark_crash_start(marker, True, power_loss=True)
    mark_crash_start(marker, True)  # a change of role's kill, before every actor recovered once
    assert crash_start_kind(marker) == POWER_LOSS
    mark_crash_start(marker, False)
    assert crash_start_kind(marker) == ""


def test_a_marker_of_an_older_engine_reads_as_a_possible_power_cut(tmp_path: Path) -> None:
    marker = tmp_path / "crash-start"
    marker.write_text("4242")  # an older engine wrote its supervisor's pid
    assert crash_start_kind(marker) == POWER_LOSS
